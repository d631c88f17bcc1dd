package apiproxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/testenv"
)

// faultyFront is an HTTPS front of a real kube-apiserver (it relays as
// the node whose certificate it holds) that answers chosen requests
// itself: an error status for every request whose path contains a
// string, a number of times or until healed.
type faultyFront struct {
	*httptest.Server
	mu      sync.Mutex
	faults  map[string]*fault
	hits    map[string]int
	relayed int // requests of after and hold faults relayed
}

type fault struct {
	code       int
	retryAfter int // seconds, 0 for none
	times      int // < 0: until healed
	// after relays the request first (the apiserver applies it), then
	// answers code instead of the apiserver's answer; hold relays it and
	// then answers nothing until the client goes away.
	after, hold bool
}

func newFaultyFront(t *testing.T, cp *testenv.ControlPlane, node *testenv.KeyPair) *faultyFront {
	t.Helper()
	api, err := url.Parse(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	serving, err := cp.CA.ServerCert("front", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(api)
	rp.FlushInterval = -1
	rp.Transport = &http.Transport{ForceAttemptHTTP2: true,
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{node.TLS}, RootCAs: cp.ServingCA}}
	f := &faultyFront{faults: map[string]*fault{}, hits: map[string]int{}}
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ft := f.take(r.URL.Path)
		if ft.after || ft.hold {
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, r)
			f.mu.Lock()
			f.relayed++
			f.mu.Unlock()
			if ft.hold {
				<-r.Context().Done()
				return
			}
		}
		if code, retryAfter := ft.code, ft.retryAfter; code != 0 {
			if retryAfter > 0 {
				w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
			}
			writeStatus(w, code, metav1.StatusReasonServiceUnavailable, nil, "injected by the test's front")
			return
		}
		rp.ServeHTTP(w, r)
	}))
	f.TLS = &tls.Config{Certificates: []tls.Certificate{serving.TLS}}
	f.EnableHTTP2 = true
	f.StartTLS()
	t.Cleanup(f.Close)
	t.Cleanup(rp.Transport.(*http.Transport).CloseIdleConnections)
	return f
}

func (f *faultyFront) take(path string) fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s, ft := range f.faults {
		if !strings.Contains(path, s) || ft.times == 0 {
			continue
		}
		f.hits[s]++
		ft.times--
		return *ft
	}
	return fault{}
}

func (f *faultyFront) fail(pathPart string, ft fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults[pathPart] = &ft
}

func (f *faultyFront) heal(pathPart string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.faults, pathPart)
}

func (f *faultyFront) hitCount(pathPart string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits[pathPart]
}

// TestReplayThroughFaults replays queued status writes to a real
// kube-apiserver through a front that answers some of them 503 or 429:
// the write refused for now backs off on its own while the others are
// applied, a write the apiserver rejects (422) is dropped, counted and
// logged with its body, and online writes are never held behind the
// stuck one.
func TestReplayThroughFaults(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const node = "edge-replay"
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	front := newFaultyFront(t, cp, kp)
	offline := &switchable{}
	e := startEdge(t, edgeSpec{net: hostNet{}, server: front.URL, node: node, cert: kp.TLS, ca: cp.CA, offline: offline})
	e.waitHealthy(true, 30*time.Second)
	kubelet, _ := e.client(kubeletUA)
	if _, err := kubelet.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := []string{"pod-stuck", "pod-ok", "pod-bad", "pod-free"}
	createWorkload(ctx, t, cp.Client, node, pods...)
	for _, p := range pods {
		if _, err := kubelet.CoreV1().Pods(workNS).Get(ctx, p, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.EventuallyNoError(t, "the pods cached", func() error {
		for _, p := range pods {
			if o, _ := e.Store.Get("kubelet", podsGVR, workNS, p); o == nil {
				return fmt.Errorf("%s not cached yet", p)
			}
		}
		return nil
	})

	offline.set(true)
	for _, w := range []struct{ pod, step string }{{"pod-stuck", "s1"}, {"pod-ok", "o1"}, {"pod-stuck", "s2"}} {
		if _, err := patchPodStep(ctx, kubelet, w.pod, w.step); err != nil {
			t.Fatalf("offline patch of %s: %v", w.pod, err)
		}
	}
	// A condition type kube-apiserver's validation refuses: accepted
	// offline, rejected (422) by the cloud.
	bad, err := kubelet.CoreV1().Pods(workNS).Get(ctx, "pod-bad", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad.Status.Conditions = append(bad.Status.Conditions, corev1.PodCondition{Type: "not a valid type!", Status: corev1.ConditionTrue})
	if _, err := kubelet.CoreV1().Pods(workNS).UpdateStatus(ctx, bad, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("offline update of pod-bad: %v", err)
	}
	// pod-stuck's second patch took the place of its first (writequeue).
	if n := e.Proxy.queue.Len(); n != 3 {
		t.Fatalf("%d writes queued, want 3", n)
	}

	front.fail("/pods/pod-stuck", fault{code: http.StatusServiceUnavailable, times: -1})
	front.fail("/pods/pod-ok", fault{code: http.StatusTooManyRequests, retryAfter: 1, times: 1})
	offline.set(false)

	// pod-ok goes through after its 429, pod-bad is rejected; pod-stuck's
	// write stays queued and is tried again, more than once.
	testenv.EventuallyNoError(t, "pod-ok applied, pod-bad rejected, pod-stuck retried", func() error {
		ok, err := cp.Client.CoreV1().Pods(workNS).Get(ctx, "pod-ok", metav1.GetOptions{})
		if err != nil {
			return err
		}
		switch {
		case podStep(ok) != "o1":
			return fmt.Errorf("pod-ok upstream at step %q", podStep(ok))
		case e.metric("tether_edge_apiserver_queue_replayed_total", "result", "rejected") != 1:
			return fmt.Errorf("pod-bad's write not rejected yet")
		case e.Proxy.queue.Len() != 1:
			return fmt.Errorf("%d queued, want pod-stuck's 1", e.Proxy.queue.Len())
		case front.hitCount("/pods/pod-stuck") < 2:
			return fmt.Errorf("pod-stuck tried %d times", front.hitCount("/pods/pod-stuck"))
		}
		return nil
	})
	if front.hitCount("/pods/pod-ok") != 1 {
		t.Errorf("the 429 was answered %d times", front.hitCount("/pods/pod-ok"))
	}
	// What the cloud refused is dropped: the operator is told what it was.
	if r := e.records.find(slog.LevelWarn, "queued status write rejected"); len(r) != 1 ||
		r[0]["path"] != "/api/v1/namespaces/"+workNS+"/pods/pod-bad/status" || !strings.Contains(r[0]["body"], "not a valid type!") {
		t.Errorf("the rejected write is not logged at warn with what it was: %v", r)
	}

	// Online, a status write of another pod is relayed at once, and one
	// of pod-stuck is queued behind (or in place of) its earlier write,
	// answered at once.
	if _, err := patchPodStep(ctx, kubelet, "pod-free", "f1"); err != nil {
		t.Fatal(err)
	}
	free, err := cp.Client.CoreV1().Pods(workNS).Get(ctx, "pod-free", metav1.GetOptions{})
	if err != nil || podStep(free) != "f1" {
		t.Errorf("pod-free upstream right after its write: %q %v", podStep(free), err)
	}
	if _, err := patchPodStep(ctx, kubelet, "pod-stuck", "s3"); err != nil {
		t.Fatalf("online patch of pod-stuck: %v", err)
	}
	// A request is counted once its handler returns, which may follow the
	// client's reading the answer: wait for the fourth count.
	queued := func() float64 {
		return e.metric("tether_edge_apiserver_requests_total", "component", "kubelet", "verb", "patch", "served", "queued")
	}
	testenv.Eventually(t, "4 kubelet patches counted as queued", func() bool { return queued() >= 4 })
	if q := queued(); q != 4 {
		t.Errorf("%v kubelet patches queued, want 4 (3 offline, pod-stuck's online one)", q)
	}

	front.heal("/pods/pod-stuck")
	testenv.EventuallyWithin(t, 3*time.Minute, "the queue replayed", func() bool { return e.Proxy.queue.Len() == 0 })
	stuck, err := cp.Client.CoreV1().Pods(workNS).Get(ctx, "pod-stuck", metav1.GetOptions{})
	if err != nil || podStep(stuck) != "s3" {
		t.Errorf("pod-stuck upstream: step %q %v, want s3", podStep(stuck), err)
	}
	// Of the five writes, pod-bad's was rejected; the others were applied
	// or took one another's place: s2 took s1's, and s3 took theirs
	// unless it came while the replay was sending them.
	applied := e.metric("tether_edge_apiserver_queue_replayed_total", "result", "applied")
	coalesced := e.metric("tether_edge_apiserver_queue_replayed_total", "result", "coalesced")
	if applied+coalesced != 4 || coalesced < 1 {
		t.Errorf("%v applied and %v coalesced, want 4 in all, at least 1 coalesced\n%s", applied, coalesced, e.logs.String())
	}
	// The ledger says the same, and balances. The 503s and the 429 came
	// before the writes were sent (to the read of the object): nothing
	// was sent twice.
	l, err := e.Store.Ledger()
	if err != nil {
		t.Fatal(err)
	}
	if !l.Balanced() || l.Enqueued != 5 || l.Rejected != 1 || float64(l.Applied) != applied || float64(l.Coalesced) != coalesced ||
		l.Obsolete != 0 || l.Resent != 0 || l.Queued != 0 || l.Unconfirmed != 0 {
		t.Errorf("ledger: %v; want 5 enqueued, 1 rejected, %v applied, %v coalesced, none resent", l, applied, coalesced)
	}
}

// TestReplayResent replays two status patches whose sends reach
// kube-apiserver without the proxy learning that they did: one answered
// 504 after the apiserver applied it, one whose answer never comes
// before the proxy is stopped (as a kill -9 between send and dequeue
// would leave it) and started again on the same cache. Each is sent
// again, counted as resent, and applied; the ledger balances and is in
// /status.
func TestReplayResent(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const node = "edge-resent"
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	front := newFaultyFront(t, cp, kp)
	offline := &switchable{}
	e := startEdge(t, edgeSpec{net: hostNet{}, server: front.URL, node: node, cert: kp.TLS, ca: cp.CA, offline: offline})
	e.waitHealthy(true, 30*time.Second)
	kubelet, _ := e.client(kubeletUA)
	pods := []string{"pod-504", "pod-held"}
	createWorkload(ctx, t, cp.Client, node, pods...)
	for _, p := range pods {
		if _, err := kubelet.CoreV1().Pods(workNS).Get(ctx, p, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.EventuallyNoError(t, "the pods cached", func() error {
		for _, p := range pods {
			if o, _ := e.Store.Get("kubelet", podsGVR, workNS, p); o == nil {
				return fmt.Errorf("%s not cached yet", p)
			}
		}
		return nil
	})
	offline.set(true)
	for _, p := range pods {
		if _, err := patchPodStep(ctx, kubelet, p, "x1"); err != nil {
			t.Fatalf("offline patch of %s: %v", p, err)
		}
	}
	// The faults match the writes' paths only (/status), not the reads.
	front.fail("/pods/pod-504/status", fault{code: http.StatusGatewayTimeout, after: true, times: 1})
	front.fail("/pods/pod-held/status", fault{hold: true, times: 1})
	offline.set(false)

	// pod-504's write is applied and answered 504 (it stays queued,
	// backing off); pod-held's is applied and held.
	testenv.EventuallyNoError(t, "both writes sent and relayed", func() error {
		if front.hitCount("/pods/pod-504/status") != 1 || front.hitCount("/pods/pod-held/status") != 1 {
			return fmt.Errorf("writes sent: pod-504 %d, pod-held %d", front.hitCount("/pods/pod-504/status"), front.hitCount("/pods/pod-held/status"))
		}
		front.mu.Lock()
		defer front.mu.Unlock()
		if front.relayed != 2 {
			return fmt.Errorf("%d relayed", front.relayed)
		}
		return nil
	})
	for _, p := range pods {
		up, err := cp.Client.CoreV1().Pods(workNS).Get(ctx, p, metav1.GetOptions{})
		if err != nil || podStep(up) != "x1" {
			t.Fatalf("%s upstream: step %q, %v; want the write applied", p, podStep(up), err)
		}
	}
	if l, err := e.Store.Ledger(); err != nil || l.Unconfirmed != 2 || l.Queued != 2 || l.Applied != 0 {
		t.Fatalf("ledger before the restart: %v, %v; want both queued and marked", l, err)
	}

	e = e.restart()
	testenv.EventuallyNoError(t, "the queue replayed after the restart", func() error {
		if n := e.Proxy.queue.Len(); n != 0 {
			return fmt.Errorf("%d still queued", n)
		}
		return nil
	})
	l, err := e.Store.Ledger()
	if err != nil {
		t.Fatal(err)
	}
	if want := (cache.Ledger{Enqueued: 2, Applied: 2, Resent: 2}); l != want {
		t.Errorf("ledger: %v\nwant %v", l, want)
	}
	st := e.Proxy.Status().QueueLedger
	if st == nil || !st.Balanced || st.Resent != 2 || st.Applied != 2 || st.Enqueued != 2 {
		t.Errorf("/status's ledger: %+v", st)
	}
	resent := e.records.find(slog.LevelInfo, "queued status write sent again: an earlier send of it may have been applied (the process ended before dequeuing it, or no answer settled it); counted as resent")
	if len(resent) != 2 {
		t.Errorf("%d writes logged as sent again, want 2: %v", len(resent), resent)
	}
}
