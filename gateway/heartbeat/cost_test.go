package heartbeat

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/gateway/internal/pooltest"
	"github.com/tether-edge/tether/gateway/pooltaint"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// countingTransport counts the requests for node Leases by method.
type countingTransport struct {
	rt http.RoundTripper
	mu sync.Mutex
	n  map[string]int // by method
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if strings.Contains(req.URL.Path, "/namespaces/"+corev1.NamespaceNodeLease+"/leases") {
		c.mu.Lock()
		c.n[req.Method]++
		c.mu.Unlock()
	}
	return c.rt.RoundTrip(req)
}

// counts returns the counts so far and starts again from zero.
func (c *countingTransport) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// TestRenewalCost: with the gateway's Lease informer, N renewals of
// Leases it holds cost N writes and no read; a write on a stale copy
// (the node renewed itself meanwhile) reads the Lease once and is
// written; a Lease the informer lacks is read, and created; all against a
// real kube-apiserver, counting the handler's requests on the wire.
func TestRenewalCost(t *testing.T) {
	const members, rounds = 4, 3
	pools := map[string]string{"leader": "pool-a"}
	for i := range members + 1 {
		pools[fmt.Sprintf("member-%d", i)] = "pool-a"
	}
	pc := pooltest.Start(t, pooltest.Options{Pools: pools})
	pc.Elect("pool-a", "leader")
	ctx := pc.Ctx
	leases := pc.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)

	// The members' own Leases, as their kubelets left them (member-0 has
	// none yet).
	base := micro(time.Now().Add(-time.Minute))
	for i := 1; i <= members; i++ {
		name := fmt.Sprintf("member-%d", i)
		if _, err := leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease, Labels: map[string]string{"kept": "yes"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40),
				RenewTime: ptr.To(metav1.NewMicroTime(base))},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The informer reads with a client of its own; the handler's client
	// is counted.
	inf, err := pooltaint.NewLeaseInformer(pc.Gateway)
	if err != nil {
		t.Fatal(err)
	}
	infCtx, stopInf := context.WithCancel(ctx)
	infDone := make(chan struct{})
	go func() { defer close(infDone); inf.RunWithContext(infCtx) }()
	t.Cleanup(func() { stopInf(); <-infDone })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("Lease informer did not sync")
	}
	cfg := pc.RESTConfig(pc.GatewayCert)
	counter := &countingTransport{n: map[string]int{}}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { counter.rt = rt; return counter }
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Options{Client: client, Leases: inf, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	reads := func(reason string) float64 {
		t.Helper()
		v, err := metrictest.Value(h.reads, "tether_gateway_delegated_heartbeat_lease_reads_total", "reason="+reason)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	delegate := func(node string, renew time.Time) {
		t.Helper()
		if rep := h.Delegate(ctx, "leader", tunnel.DelegateRequest{Node: node, Lease: leaseJSON(t, corev1.NamespaceNodeLease, node, renew)}); rep.Code != tunnel.OK {
			t.Fatalf("renewal of %s: %+v, want OK", node, rep)
		}
	}
	// seen waits until the informer holds node's Lease renewed at renew,
	// as it does between a leader's renewals (seconds apart).
	seen := func(node string, renew time.Time) {
		t.Helper()
		testenv.Eventually(t, fmt.Sprintf("the informer to see %s renewed at %v", node, renew), func() bool {
			l := h.cached(node)
			return l != nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.Time.Equal(renew)
		})
	}

	// The steady state: one write per renewal, no read.
	counter.counts()
	for r := 1; r <= rounds; r++ {
		renew := base.Add(time.Duration(r) * time.Second)
		for i := 1; i <= members; i++ {
			delegate(fmt.Sprintf("member-%d", i), renew)
		}
		for i := 1; i <= members; i++ {
			seen(fmt.Sprintf("member-%d", i), renew)
		}
	}
	if got, want := counter.counts(), map[string]int{http.MethodPut: members * rounds}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%d renewals sent %v to the apiserver, want %v", members*rounds, got, want)
	}
	if n := reads(readNotCached) + reads(readConflict); n != 0 {
		t.Errorf("%v Lease reads counted, want 0", n)
	}
	for i := 1; i <= members; i++ {
		l, err := leases.Get(ctx, fmt.Sprintf("member-%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !l.Spec.RenewTime.Time.Equal(base.Add(rounds*time.Second)) || l.Labels["kept"] != "yes" || l.Annotations["openyurt.io/delegate-heartbeat"] != "true" {
			t.Errorf("Lease after the renewals: %+v", l)
		}
	}
	// A renewal no newer than the cached Lease's: OK, and no request.
	delegate("member-1", base)
	if got := counter.counts(); len(got) != 0 {
		t.Errorf("an old renewal sent %v, want nothing", got)
	}

	// The node renews itself while the informer is stopped (its copy is
	// stale): the write conflicts, the Lease is read and written.
	stopInf()
	<-infDone
	own, err := leases.Get(ctx, "member-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	own.Spec.RenewTime = ptr.To(metav1.NewMicroTime(base.Add(10 * time.Second)))
	if _, err := leases.Update(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	renew := base.Add(20 * time.Second)
	delegate("member-2", renew)
	if got, want := counter.counts(), map[string]int{http.MethodPut: 2, http.MethodGet: 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("a renewal on a stale copy sent %v, want %v", got, want)
	}
	if n := reads(readConflict); n != 1 {
		t.Errorf("conflict reads %v, want 1", n)
	}
	if l, err := leases.Get(ctx, "member-2", metav1.GetOptions{}); err != nil || !l.Spec.RenewTime.Time.Equal(renew) || l.Labels["kept"] != "yes" {
		t.Fatalf("Lease after the conflict: %v %+v", err, l)
	}
	// Older than the stored renewal, newer than the stale copy: the write
	// conflicts, the Lease is read, and nothing moves back.
	delegate("member-2", base.Add(15*time.Second))
	if got, want := counter.counts(), map[string]int{http.MethodPut: 1, http.MethodGet: 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("an old renewal on a stale copy sent %v, want %v (the write refused)", got, want)
	}
	if l, err := leases.Get(ctx, "member-2", metav1.GetOptions{}); err != nil || !l.Spec.RenewTime.Time.Equal(renew) {
		t.Fatalf("Lease after an older renewal: %v %+v", err, l)
	}

	// A Lease the informer does not hold: read (404) and created.
	delegate("member-0", renew)
	if got, want := counter.counts(), map[string]int{http.MethodGet: 1, http.MethodPost: 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("a renewal of a Lease not cached sent %v, want %v", got, want)
	}
	if n := reads(readNotCached); n < 1 {
		t.Errorf("not_cached reads %v, want at least 1", n)
	}
}

// TestThrottled: a renewal that would wait longer than MaxWait for a
// request token is answered unavailable at once, without a request, and
// counted; the budget is the handler's own.
func TestThrottled(t *testing.T) {
	pc := pooltest.Start(t, pooltest.Options{Pools: map[string]string{"leader": "pool-a", "member": "pool-a"}})
	pc.Elect("pool-a", "leader")
	cfg := pc.RESTConfig(pc.GatewayCert)
	counter := &countingTransport{n: map[string]int{}}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { counter.rt = rt; return counter }
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Two tokens, then one an hour: the first renewal (GET 404 + create)
	// takes both.
	h, err := New(Options{Client: client, Requests: rate.NewLimiter(rate.Every(time.Hour), 2), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	renew := micro(time.Now().Add(-time.Minute))
	send := func(renew time.Time) tunnel.Reply {
		return h.Delegate(pc.Ctx, "leader", tunnel.DelegateRequest{Node: "member", Lease: leaseJSON(t, corev1.NamespaceNodeLease, "member", renew)})
	}
	if rep := send(renew); rep.Code != tunnel.OK {
		t.Fatalf("first renewal: %+v, want OK", rep)
	}
	counter.counts()
	rep := send(renew.Add(time.Second))
	if rep.Code != tunnel.Unavailable || !strings.Contains(rep.Message, "budget") {
		t.Fatalf("renewal without a token: %+v, want unavailable (budget spent)", rep)
	}
	if got := counter.counts(); len(got) != 0 {
		t.Errorf("a throttled renewal sent %v, want nothing", got)
	}
	v, err := metrictest.Value(h.throttled, "tether_gateway_delegated_heartbeats_throttled_total")
	if err != nil {
		t.Fatal(err)
	}
	if v != 1 {
		t.Errorf("throttled %v, want 1", v)
	}
	if got, err := metrictest.Value(h.results, "tether_gateway_delegated_heartbeats_total", "result=unavailable"); err != nil || got != 1 {
		t.Errorf("unavailable %v (%v), want 1", got, err)
	}
}
