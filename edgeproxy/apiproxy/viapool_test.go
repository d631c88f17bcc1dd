package apiproxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/testenv"
)

// A Lease kubelet renews itself after the gateway had written it for the
// node (delegated) goes upstream without the annotation; one without it
// goes as it came.
func TestWithoutDelegateAnnotation(t *testing.T) {
	lease := &coordinationv1.Lease{
		TypeMeta: metav1.TypeMeta{Kind: "Lease", APIVersion: "coordination.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "kube-node-lease", ResourceVersion: "7",
			Annotations: map[string]string{DelegateHeartbeatAnnotation: "true", "keep": "me"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("n")},
	}
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	var pb bytes.Buffer
	if err := info.Serializer.Encode(lease, &pb); err != nil {
		t.Fatal(err)
	}
	out := withoutDelegateAnnotation(runtime.ContentTypeProtobuf, pb.Bytes())
	var got coordinationv1.Lease
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if _, ok := got.Annotations[DelegateHeartbeatAnnotation]; ok || got.Annotations["keep"] != "me" ||
		got.ResourceVersion != "7" || *got.Spec.HolderIdentity != "n" {
		t.Fatalf("stripped Lease: %+v", got)
	}

	delete(lease.Annotations, DelegateHeartbeatAnnotation)
	plain, _ := json.Marshal(lease)
	if out := withoutDelegateAnnotation("application/json", plain); out != nil {
		t.Fatalf("a Lease without the annotation was rewritten: %s", out)
	}
}

// replicaPool is a Pool whose replica serves every resource while serves
// is set, and answers a watch with one event and then nothing, as a
// replica whose leader stopped syncing does.
type replicaPool struct {
	serves  atomic.Bool
	watches atomic.Int32 // watches the replica answered
}

func (f *replicaPool) Serves(schema.GroupVersionResource, bool) bool { return f.serves.Load() }

func (f *replicaPool) Transport() http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		f.watches.Add(1)
		pr, pw := io.Pipe()
		go func() {
			io.WriteString(pw, `{"type":"ADDED","object":{"kind":"Service","apiVersion":"v1","metadata":{"name":"s","namespace":"ns","resourceVersion":"5"}}}`+"\n")
			<-r.Context().Done()
			pw.CloseWithError(r.Context().Err())
		}()
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: pr, Request: r}, nil
	})
}

func (f *replicaPool) DelegateHeartbeat(context.Context, []byte) error { return nil }

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A watch served from the pool's replica ends once the replica no longer
// serves (the leader's sync went stale while the cloud is reachable), so
// that the client watches again from the cloud instead of waiting on a
// replica that gets no changes; while the replica serves, it stays open.
func TestPoolWatchEndsWhenTheReplicaStopsServing(t *testing.T) {
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			w.Write([]byte("ok"))
			return
		}
		http.Error(w, "the test expects no request to the cloud", http.StatusTeapot)
	}))
	api.EnableHTTP2 = true
	api.StartTLS()
	defer api.Close()
	kp, _ := testenv.MustCA(t, "pool-watch").NodeCert("n")
	pool := &replicaPool{}
	pool.serves.Store(true)
	e := startEdge(t, edgeSpec{net: hostNet{}, server: api.URL, node: "n", cert: kp.TLS, pool: pool,
		rootCAs: api.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs})
	e.waitHealthy(true, 10*time.Second)

	req, _ := http.NewRequest("GET", "http://"+e.Addr+"/api/v1/services?watch=true&resourceVersion=1", nil)
	req.Header.Set("User-Agent", kubeletUA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	select {
	case l := <-lines:
		var ev watchEvent
		if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.Type != "ADDED" {
			t.Fatalf("first event %q: %v", l, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event from the replica")
	}
	if n := pool.watches.Load(); n != 1 {
		t.Fatalf("%d watches reached the replica, want 1", n)
	}
	// The harness rechecks every 2 s: the watch outlives two rechecks.
	select {
	case l, ok := <-lines:
		t.Fatalf("while the replica serves: line %q, open %v", l, ok)
	case <-time.After(5 * time.Second):
	}
	pool.serves.Store(false)
	select {
	case l, ok := <-lines:
		if ok {
			t.Fatalf("after the replica stopped serving: line %q, want the end of the watch", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch from the replica is still open 10 s after the replica stopped serving")
	}
	if n := e.metric("tether_edge_apiserver_pool_watches_ended_total"); n != 1 {
		t.Errorf("pool_watches_ended_total = %v, want 1", n)
	}
}
