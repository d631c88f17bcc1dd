package gateway

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/gateway/internal/pooltest"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore"
	"github.com/tether-edge/tether/poolstore/elect"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/poolstore/replica"
	"github.com/tether-edge/tether/tunnel"
)

// TestElectionThroughTunnel runs the whole gateway, with the identity and
// RBAC of packaging/kubernetes/gateway-rbac.yaml, against a real
// kube-apiserver with the edges' RBAC (edge-rbac.yaml, pool-rbac.yaml:
// nodes only read the election records), and tether-edge's tunnel client
// over real QUIC: edge-1 and edge-2 of pool-a campaign with poolstore's
// elector, reading the record with their node identities and having it
// written through their tunnels (edgetunnel.PoolRecords). One leads and
// its sync record is written the same way; a node of another pool, and
// the follower, are refused; the stopped leader's release lets the other
// take over at once; with the gateway gone the leader stops leading.
func TestElectionThroughTunnel(t *testing.T) {
	pc := pooltest.Start(t, pooltest.Options{Manifests: []string{"edge-rbac.yaml", "pool-rbac.yaml"},
		Pools: map[string]string{"edge-1": "pool-a", "edge-2": "pool-a", "edge-3": "pool-b"}, Labels: map[string]string{nodewatch.EdgeLabel: "true"}})
	cp, ctx := pc.ControlPlane, pc.Ctx
	cms := cp.Client.CoreV1().ConfigMaps(record.Namespace)

	// The gateway, as user tether-gateway.
	cfg, ca := testConfig(t, cp.Kubeconfig(t, "tether-gateway", pc.GatewayCert))
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopGateway := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(runCtx) }()
	var stopOnce sync.Once
	stop := func() {
		stopOnce.Do(func() {
			stopGateway()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	defer stop()
	admin := "http://" + g.AdminAddr().String()
	testenv.Eventually(t, "/readyz answers ok", func() bool { return httpGet(t, admin+"/readyz") == "ok\n" })

	// The edges' tunnels, and the candidates of pool-a.
	tunnels := map[string]*edgetunnel.Client{}
	for _, node := range []string{"edge-1", "edge-2", "edge-3"} {
		tunnels[node] = startTunnel(t, ctx, g, ca, node)
	}
	var cands []*tunnelCandidate
	for _, node := range []string{"edge-1", "edge-2"} {
		cands = append(cands, startTunnelCandidate(t, ctx, cp, node, tunnels[node]))
	}
	var first, second *tunnelCandidate
	testenv.Eventually(t, "one of pool-a's edges leads", func() bool {
		var leaders []*tunnelCandidate
		for _, c := range cands {
			if _, leading := c.elector.Leader(); leading {
				leaders = append(leaders, c)
			}
		}
		if len(leaders) != 1 {
			return false
		}
		first = leaders[0]
		return true
	})
	for _, c := range cands {
		if c != first {
			second = c
		}
	}
	t.Logf("%s leads pool-a", first.node)
	testenv.Eventually(t, "the follower sees the leader", func() bool { l, _ := second.elector.Leader(); return l == first.node })
	el, err := record.ReadLeader(ctx, cms, "pool-a")
	if err != nil || el.Holder != first.node {
		t.Fatalf("election record in the cloud: %+v, %v; want %s", el, err, first.node)
	}
	// The leader's sync record, written through its tunnel too.
	testenv.Eventually(t, "the leader's sync record in the cloud", func() bool {
		cm, err := cms.Get(ctx, record.SyncName("pool-a"), metav1.GetOptions{})
		return err == nil && cm.Data["holderIdentity"] == first.node
	})

	// Refused: a node of pool-b taking pool-a's record, or creating
	// pool-b's for another node; the follower releasing the leader's.
	cm, err := cms.Get(ctx, record.ElectionName("pool-a"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	take := cm.DeepCopy()
	record.SetElection(take, record.Election{HolderIdentity: "edge-3", LeaseDurationSeconds: 15, AcquireTime: now, RenewTime: now})
	elsewhere := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.ElectionName("pool-b"), Namespace: record.Namespace}}
	record.SetElection(elsewhere, record.Election{HolderIdentity: "edge-1", LeaseDurationSeconds: 15, AcquireTime: now, RenewTime: now})
	release := cm.DeepCopy()
	record.SetElection(release, record.Election{LeaseDurationSeconds: 1, AcquireTime: now, RenewTime: now})
	for _, tc := range []struct {
		sender string
		op     tunnel.ElectionOp
		pool   string
		cm     *corev1.ConfigMap
		want   tunnel.Code
	}{
		{"edge-3", tunnel.ElectionUpdate, "pool-a", take, tunnel.OtherPool},
		{"edge-3", tunnel.ElectionCreate, "pool-b", elsewhere, tunnel.NotHolder},
		{second.node, tunnel.ElectionUpdate, "pool-a", release, tunnel.NotLeader},
	} {
		b, err := json.Marshal(tc.cm)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tunnels[tc.sender].WriteElectionRecord(ctx, tunnel.ElectionRequest{Op: tc.op, Record: tunnel.RecordElection, Pool: tc.pool, ConfigMap: b})
		var refused *edgetunnel.ElectionRefusedError
		if !errors.As(err, &refused) || refused.Code != tc.want {
			t.Errorf("%s writing %s: %v, want a %v refusal", tc.sender, tc.cm.Name, err, tc.want)
		}
	}
	if el, err := record.ReadLeader(ctx, cms, "pool-a"); err != nil || el.Holder != first.node {
		t.Fatalf("pool-a's record after the refusals: %+v, %v; want %s's", el, err, first.node)
	}
	if _, err := cms.Get(ctx, record.ElectionName("pool-b"), metav1.GetOptions{}); err == nil {
		t.Fatal("pool-b's record was created")
	}
	metrics := httpGet(t, admin+"/metrics")
	for _, want := range []string{
		`tether_gateway_election_writes_total{result="other_pool"} 1`,
		`tether_gateway_election_writes_total{result="not_holder"} 1`,
		`tether_gateway_election_writes_total{result="not_leader"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if !strings.Contains(metrics, `tether_gateway_election_writes_total{result="ok"} `) ||
		strings.Contains(metrics, `tether_gateway_election_writes_total{result="ok"} 0`) {
		t.Errorf("/metrics counts no election record written:\n%s", grepLines(metrics, "election_writes"))
	}

	// The leader stops: its release, through its tunnel, lets the other
	// take over at its next try, well within a lease duration.
	first.stop()
	stopped := time.Now()
	testenv.Eventually(t, second.node+" leads", func() bool { _, leading := second.elector.Leader(); return leading })
	t.Logf("%s leads %v after %s stopped", second.node, time.Since(stopped).Round(time.Millisecond), first.node)
	if el, err := record.ReadLeader(ctx, cms, "pool-a"); err != nil || el.Holder != second.node {
		t.Fatalf("election record in the cloud: %+v, %v; want %s", el, err, second.node)
	}

	// Without a gateway, no renewal is written: the leader stops leading
	// after its renew deadline, and the record still names it.
	stop()
	testenv.Eventually(t, second.node+" stops leading without a gateway", func() bool { _, leading := second.elector.Leader(); return !leading })
	if el, err := record.ReadLeader(ctx, cms, "pool-a"); err != nil || el.Holder != second.node {
		t.Fatalf("election record in the cloud: %+v, %v; want %s's, unchanged", el, err, second.node)
	}
}

// startTunnel connects node's tunnel client to g.
func startTunnel(t *testing.T, ctx context.Context, g *Gateway, ca *testenv.CA, node string) *edgetunnel.Client {
	t.Helper()
	kp, err := ca.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	c, err := edgetunnel.New(edgetunnel.Options{
		Gateways:    []string{g.TunnelAddr().String()},
		ServerName:  "gateway",
		RootCAs:     ca.Pool,
		Certificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &kp.TLS, nil },
		AllowPorts:  []uint16{10250},
	})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	testenv.Eventually(t, node+" connected", func() bool { return c.Ready() == nil })
	return c
}

// tunnelCandidate is a node of pool-a campaigning as tether-edge does:
// poolstore's elector and, while it leads, its FeedSource, taking the
// gateway's signed feed and writing the records through its tunnel.
type tunnelCandidate struct {
	node    string
	elector *elect.Elector
	stop    func()
}

func startTunnelCandidate(t *testing.T, ctx context.Context, cp *testenv.ControlPlane, node string, tun *edgetunnel.Client) *tunnelCandidate {
	t.Helper()
	_, cfg, _ := cp.NodeClient(t, node)
	client, err := kube.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	records := edgetunnel.PoolRecords{Client: tun}
	el, err := elect.New(elect.Options{Client: client, Records: records, Pool: "pool-a", Node: node,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	store, err := replica.Open(filepath.Join(t.TempDir(), replica.FileName), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	verifier, err := feed.NewVerifier(feed.VerifierOptions{Roots: tun.RootCAs(), Names: tun.GatewayNames()})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		el.Run(cctx, func(ctx context.Context) {
			if err := store.StartEpoch(fmt.Sprintf("%s/%d", node, time.Now().UnixNano())); err != nil {
				t.Errorf("start epoch: %v", err)
				return
			}
			poolstore.NewFeedSource(poolstore.FeedSourceOptions{Store: store, Verifier: verifier, Client: client, Records: records,
				Pool: "pool-a", Node: node, Open: func(ctx context.Context) (io.ReadCloser, error) { return tun.PoolFeed(ctx, "pool-a") }}).Run(ctx)
		})
	}()
	var once sync.Once
	c := &tunnelCandidate{node: node, elector: el, stop: func() { once.Do(func() { cancel(); <-done }) }}
	t.Cleanup(c.stop)
	return c
}

// grepLines are the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
