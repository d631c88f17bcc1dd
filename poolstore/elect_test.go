package poolstore

import (
	"context"
	"crypto"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/gateway/poolfeed"
	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/elect"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/poolstore/replica"
)

// poolRBAC are the manifests that let node identities read the election
// records and the pool-scope resources.
var poolRBAC = []string{"../packaging/kubernetes/edge-rbac.yaml", "../packaging/kubernetes/pool-rbac.yaml"}

// candidate is one node campaigning, with a Source in its store while it
// leads.
type candidate struct {
	node    string
	elector *elect.Elector
	store   *replica.Store
	cancel  context.CancelFunc
	done    chan struct{}
}

// campaign runs node's election with its node identity, which reads the
// records; records writes them, as the gateway does for tether-edge.
func campaign(t *testing.T, ctx context.Context, cp *testenv.ControlPlane, node string, records record.Writer, gw *testGateway, fd *poolfeed.Feed) *candidate {
	t.Helper()
	_, cfg, _ := cp.NodeClient(t, node)
	client, err := kube.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	el, err := elect.New(elect.Options{Client: client, Records: records, Pool: "p1", Node: node,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c := &candidate{node: node, elector: el, store: open(t, filepath.Join(t.TempDir(), replica.FileName)), done: make(chan struct{})}
	cctx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	go func() {
		defer close(c.done)
		el.Run(cctx, func(ctx context.Context) {
			c.store.StartEpoch(fmt.Sprintf("%s/%d", node, time.Now().UnixNano()))
			NewFeedSource(FeedSourceOptions{Store: c.store, Verifier: newVerifier(t, gw), Client: client, Records: records,
				Pool: "p1", Node: node, Open: servePipe(fd)}).Run(ctx)
		})
	}()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

// leaders returns the candidates that say they lead.
func leaders(cs []*candidate) []*candidate {
	var out []*candidate
	for _, c := range cs {
		if _, leading := c.elector.Leader(); leading {
			out = append(out, c)
		}
	}
	return out
}

// TestElectionAndSource campaigns with three node identities against a
// real apiserver (with the shipped RBAC): they read the records, and an
// administrator's client writes them for them (the gateway's part in
// tether-edge; nodes may not write them, which is checked first). One
// leads and fills its store from the cloud; when it stops, another takes
// over and has the same data.
func TestElectionAndSource(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, poolRBAC...); err != nil {
		t.Fatal(err)
	}
	createSlices(t, ctx, cp.Client, 0, 20)

	// A node identity may read the records but write none.
	nodeClient, _, _ := cp.NodeClient(t, "edge-0")
	nodeCMs := nodeClient.CoreV1().ConfigMaps(record.Namespace)
	testenv.EventuallyWithin(t, 10*time.Second, "RBAC lets a node read the records", func() bool {
		_, err := nodeCMs.Get(ctx, record.ElectionName("p1"), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if _, err := nodeCMs.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.ElectionName("p1")}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("a node created its pool's election record: %v; want forbidden", err)
	}

	admin, err := kube.NewForConfig(cp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	records := record.ClientWriter{ConfigMaps: admin.ConfigMaps(record.Namespace)}
	// The gateway's feed, in process: the leader's data comes from it.
	gw := newTestGateway(t, "gateway-ca")
	fd, err := poolfeed.New(poolfeed.Options{Client: admin, Name: "gw-test", MarkEvery: time.Second,
		Signer: func() (crypto.Signer, [][]byte, error) {
			return gw.kp.TLS.PrivateKey.(crypto.Signer), gw.kp.TLS.Certificate, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	go fd.Run(ctx)
	var cs []*candidate
	for i := range 3 {
		cs = append(cs, campaign(t, ctx, cp, fmt.Sprint("edge-", i), records, gw, fd))
	}
	testenv.EventuallyWithin(t, 10*time.Second, "a leader", func() bool { return len(leaders(cs)) == 1 })
	first := leaders(cs)[0]
	testenv.EventuallyWithin(t, 10*time.Second, "the leader's store has the slices", func() bool { return countSlices(first.store) == 20 })
	for _, c := range cs {
		if c != first {
			testenv.EventuallyWithin(t, 5*time.Second, "followers see the leader", func() bool { l, _ := c.elector.Leader(); return l == first.node })
		}
	}
	createSlices(t, ctx, cp.Client, 20, 25)
	testenv.EventuallyWithin(t, 5*time.Second, "a new slice in the leader's store", func() bool { return countSlices(first.store) == 25 })
	testenv.EventuallyWithin(t, 15*time.Second, "the sync mark", func() bool { return !first.store.SyncedAt().IsZero() })
	testenv.EventuallyWithin(t, 5*time.Second, "the sync record in the cloud", func() bool {
		rec, err := cp.Client.CoreV1().ConfigMaps(record.Namespace).Get(ctx, record.SyncName("p1"), metav1.GetOptions{})
		return err == nil && rec.Data["holderIdentity"] == first.node
	})
	el, err := record.ReadLeader(ctx, cp.Client.CoreV1().ConfigMaps(record.Namespace), "p1")
	if err != nil || el.Holder != first.node || !el.Expires(record.DefaultLeaseDuration).After(time.Now()) {
		t.Fatalf("election record: %+v, %v", el, err)
	}

	// Stopping the leader releases the Lease: another node leads at once.
	stopped := time.Now()
	first.cancel()
	<-first.done
	rest := slicesWithout(cs, first)
	// Within the lease (3 s) and a retry or so, not the lease after a
	// missed renewal: the record was released.
	testenv.EventuallyWithin(t, 3*time.Second+2*time.Second, "a new leader", func() bool { return len(leaders(rest)) == 1 })
	t.Logf("new leader %s %v after the old one stopped", leaders(rest)[0].node, time.Since(stopped).Round(time.Millisecond))
	second := leaders(rest)[0]
	testenv.EventuallyWithin(t, 10*time.Second, "the new leader's store", func() bool { return countSlices(second.store) == 25 })
}

func slicesWithout(cs []*candidate, c *candidate) []*candidate {
	var out []*candidate
	for _, x := range cs {
		if x != c {
			out = append(out, x)
		}
	}
	return out
}

var createMu sync.Mutex

func createSlices(t *testing.T, ctx context.Context, c kubernetes.Interface, from, to int) {
	t.Helper()
	createMu.Lock()
	defer createMu.Unlock()
	for i := from; i < to; i++ {
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("s-", i), Namespace: "default",
			Labels: map[string]string{discoveryv1.LabelServiceName: "svc"}}, AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)}}}}
		if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func countSlices(s *replica.Store) int {
	objs, _, _, _ := s.List(replica.ResourceKey(DefaultResources[0]))
	return len(objs)
}

// servePipe opens fd's feed in process, as a tunnel stream would carry it.
func servePipe(fd *poolfeed.Feed) func(ctx context.Context) (io.ReadCloser, error) {
	return func(ctx context.Context) (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(fd.Serve(ctx, pw)) }()
		return pr, nil
	}
}
