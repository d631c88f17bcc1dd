package heartbeat

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	testclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/gateway/internal/pooltest"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/tunnel"
)

// cluster is a real apiserver with the gateway's RBAC applied, nodes in
// pools, and a Handler that acts with the gateway's identity.
type cluster struct {
	t      *testing.T
	ctx    context.Context
	admin  kubernetes.Interface
	h      *Handler
	clock  *testclock.FakePassiveClock
	result *prometheus.CounterVec
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	pc := pooltest.Start(t, pooltest.Options{Pools: map[string]string{
		"leader": "pool-a", "member": "pool-a", "member-2": "pool-a",
		"other": "pool-b", "other-leader": "pool-b", "loner": "",
	}})
	c := &cluster{t: t, ctx: pc.Ctx, admin: pc.Client, clock: testclock.NewFakePassiveClock(time.Now())}
	var err error
	c.h, err = New(Options{Client: pc.Gateway, Clock: c.clock, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	c.result = c.h.results
	// pool-a is led by "leader", with the pool's real election; pool-b has
	// no leader.
	pc.Elect("pool-a", "leader")
	return c
}

// leaseJSON is a node Lease as a kubelet writes it.
func leaseJSON(t *testing.T, ns, name string, renew time.Time) []byte {
	t.Helper()
	l := coordinationv1.Lease{
		TypeMeta:   metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, ResourceVersion: "1", UID: "uid-from-the-edge"},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(name),
			LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime:            ptr.To(metav1.NewMicroTime(renew)),
		},
	}
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (c *cluster) lease(node string) (*coordinationv1.Lease, error) {
	return c.admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(c.ctx, node, metav1.GetOptions{})
}

func (c *cluster) count(code tunnel.Code) float64 {
	c.t.Helper()
	v, err := metrictest.Value(c.result, "tether_gateway_delegated_heartbeats_total", "result="+code.String())
	if err != nil {
		c.t.Fatal(err)
	}
	return v
}

// micro is t as a Lease holds it.
func micro(t time.Time) time.Time { return t.Truncate(time.Microsecond) }

// TestDelegate: the pool's leader has its members' Leases written, created
// or updated, with the annotation and the renewal time it sent.
func TestDelegate(t *testing.T) {
	c := newCluster(t)
	renew := micro(c.clock.Now())

	// No Lease yet: created.
	rep := c.h.Delegate(c.ctx, "leader", tunnel.DelegateRequest{Node: "member", Lease: leaseJSON(t, corev1.NamespaceNodeLease, "member", renew)})
	if rep.Code != tunnel.OK {
		t.Fatalf("reply %+v, want OK", rep)
	}
	l, err := c.lease("member")
	if err != nil {
		t.Fatal(err)
	}
	if l.Annotations[openyurt.DelegateHeartbeatAnnotation] != "true" || !l.Spec.RenewTime.Time.Equal(renew) ||
		ptr.Deref(l.Spec.HolderIdentity, "") != "member" || ptr.Deref(l.Spec.LeaseDurationSeconds, 0) != 40 {
		t.Fatalf("Lease after the delegated heartbeat: %+v", l)
	}
	if l.UID == "uid-from-the-edge" {
		t.Error("the Lease's metadata came from the edge")
	}

	// The node's own Lease, with labels and owner of its own: updated;
	// what the edge did not send is kept. An empty namespace in the sent
	// Lease stands for kube-node-lease.
	own := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "member-2", Namespace: corev1.NamespaceNodeLease, Labels: map[string]string{"kept": "yes"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("member-2"), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: ptr.To(metav1.NewMicroTime(renew.Add(-10 * time.Second)))},
	}
	if _, err := c.admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(c.ctx, own, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if rep := c.h.Delegate(c.ctx, "leader", tunnel.DelegateRequest{Node: "member-2", Lease: leaseJSON(t, "", "member-2", renew)}); rep.Code != tunnel.OK {
		t.Fatalf("reply %+v, want OK", rep)
	}
	l, err = c.lease("member-2")
	if err != nil {
		t.Fatal(err)
	}
	if l.Annotations[openyurt.DelegateHeartbeatAnnotation] != "true" || !l.Spec.RenewTime.Time.Equal(renew) || l.Labels["kept"] != "yes" {
		t.Fatalf("Lease after the delegated heartbeat: %+v", l)
	}

	// An older renewal (a retry, or overtaken by the node's own) is
	// answered OK and moves nothing back.
	rv := l.ResourceVersion
	if rep := c.h.Delegate(c.ctx, "leader", tunnel.DelegateRequest{Node: "member-2", Lease: leaseJSON(t, corev1.NamespaceNodeLease, "member-2", renew.Add(-time.Second))}); rep.Code != tunnel.OK {
		t.Fatalf("older renewal: reply %+v, want OK", rep)
	}
	if l, err := c.lease("member-2"); err != nil || l.ResourceVersion != rv {
		t.Fatalf("older renewal was written: %v %+v", err, l)
	}
	if got := c.count(tunnel.OK); got != 3 {
		t.Errorf("ok count %v, want 3", got)
	}
}

// TestRefusals: whatever is refused leaves the Leases as they were, and is
// counted by its reason.
func TestRefusals(t *testing.T) {
	c := newCluster(t)
	renew := micro(time.Now())
	// member's own Lease, which no refusal may touch.
	own := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "member", Namespace: corev1.NamespaceNodeLease},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("member"), RenewTime: ptr.To(metav1.NewMicroTime(renew.Add(-time.Minute)))},
	}
	own, err := c.admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(c.ctx, own, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lease := func(node string) []byte { return leaseJSON(t, corev1.NamespaceNodeLease, node, renew) }
	for _, tc := range []struct {
		name         string
		sender, node string
		lease        []byte
		clock        time.Duration // how far the gateway's clock is ahead
		want         tunnel.Code
	}{
		{"sender does not lead", "member-2", "member", lease("member"), 0, tunnel.NotLeader},
		{"the delegated node leads, not the sender", "member", "leader", lease("leader"), 0, tunnel.NotLeader},
		{"sender's election record expired", "leader", "member", lease("member"), time.Hour, tunnel.LeaderExpired},
		{"nodes in different pools", "leader", "other", lease("other"), 0, tunnel.OtherPool},
		{"delegated node without a pool", "leader", "loner", lease("loner"), 0, tunnel.NotInPool},
		{"sender without a pool", "loner", "member", lease("member"), 0, tunnel.NotInPool},
		{"delegated node unknown", "leader", "ghost", lease("ghost"), 0, tunnel.UnknownNode},
		{"sender unknown", "ghost", "member", lease("member"), 0, tunnel.UnknownNode},
		{"pool without a leader", "other-leader", "other", lease("other"), 0, tunnel.NotLeader},
		{"Lease of another node", "leader", "member", lease("member-2"), 0, tunnel.BadLease},
		{"Lease in another namespace", "leader", "member", leaseJSON(t, "default", "member", renew), 0, tunnel.BadLease},
		{"not JSON", "leader", "member", []byte("renew me"), 0, tunnel.BadLease},
		{"not a Lease", "leader", "member", []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"member","namespace":"kube-node-lease"}}`), 0, tunnel.BadLease},
		{"no renewTime", "leader", "member", []byte(`{"metadata":{"name":"member","namespace":"kube-node-lease"},"spec":{}}`), 0, tunnel.BadLease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.clock.SetTime(time.Now().Add(tc.clock))
			before := c.count(tc.want)
			rep := c.h.Delegate(c.ctx, tc.sender, tunnel.DelegateRequest{Node: tc.node, Lease: tc.lease})
			if rep.Code != tc.want || rep.Message == "" {
				t.Fatalf("reply %+v, want %v with a message", rep, tc.want)
			}
			if got := c.count(tc.want); got != before+1 {
				t.Errorf("%v count %v, want %v", tc.want, got, before+1)
			}
			if l, err := c.lease("member"); err != nil || l.ResourceVersion != own.ResourceVersion {
				t.Errorf("member's Lease changed: %v %+v", err, l)
			}
			for _, n := range []string{"leader", "member-2", "other", "loner", "ghost"} {
				if _, err := c.lease(n); !apierrors.IsNotFound(err) {
					t.Errorf("Lease of %s: %v, want none written", n, err)
				}
			}
		})
	}
	c.clock.SetTime(time.Now())
	if rep := c.h.Delegate(c.ctx, "leader", tunnel.DelegateRequest{Node: "member", Lease: lease("member")}); rep.Code != tunnel.OK {
		t.Fatalf("after the refusals, the leader's heartbeat: %+v, want OK", rep)
	}
}

// An apiserver error is Unavailable (another replica may do better), and
// nothing is written.
func TestUnavailable(t *testing.T) {
	c := newCluster(t)
	h, err := New(Options{Client: c.admin, Nodes: failingNodes{}, Clock: c.clock})
	if err != nil {
		t.Fatal(err)
	}
	rep := h.Delegate(c.ctx, "leader", tunnel.DelegateRequest{Node: "member", Lease: leaseJSON(t, corev1.NamespaceNodeLease, "member", time.Now())})
	if rep.Code != tunnel.Unavailable {
		t.Fatalf("reply %+v, want unavailable", rep)
	}
	if _, err := c.lease("member"); !apierrors.IsNotFound(err) {
		t.Fatalf("Lease of member: %v, want none written", err)
	}
}

// TestRenewTimeClampedToGatewayClock: a renewal from the future is
// written as the gateway's now, and a Lease renewed in the future does not
// make the honest renewals after it look old.
func TestRenewTimeClampedToGatewayClock(t *testing.T) {
	c := newCluster(t)
	start := micro(c.clock.Now())
	clamped := func(reason string) float64 {
		t.Helper()
		v, err := metrictest.Value(c.h.clamped, "tether_gateway_delegated_heartbeats_clamped_total", "reason="+reason)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	delegate := func(node string, renew time.Time) {
		t.Helper()
		rep := c.h.Delegate(c.ctx, "leader", tunnel.DelegateRequest{Node: node, Lease: leaseJSON(t, corev1.NamespaceNodeLease, node, renew)})
		if rep.Code != tunnel.OK {
			t.Fatalf("renewal of %s at %v: reply %+v, want OK", node, renew, rep)
		}
	}
	renewTime := func(node string) time.Time {
		t.Helper()
		l, err := c.lease(node)
		if err != nil {
			t.Fatal(err)
		}
		return l.Spec.RenewTime.Time
	}

	// A day ahead: written as the gateway's now.
	delegate("member", start.Add(24*time.Hour))
	if got := renewTime("member"); !got.Equal(start) {
		t.Fatalf("renewTime %v, want the gateway's now %v", got, start)
	}
	if n := clamped(clampedSent); n != 1 {
		t.Fatalf("clamped sent_in_future %v, want 1", n)
	}
	// The honest renewals after it are written. (Seconds apart: the
	// gateway's clock stays within the election record's term, which the
	// elector renews on the real clock.)
	for i := 1; i <= 3; i++ {
		now := start.Add(time.Duration(i) * time.Second)
		c.clock.SetTime(now)
		delegate("member", now)
		if got := renewTime("member"); !got.Equal(now) {
			t.Fatalf("honest renewal %d: renewTime %v, want %v", i, got, now)
		}
	}
	if n := clamped(clampedSent); n != 1 {
		t.Fatalf("clamped sent_in_future %v, want still 1", n)
	}

	// A Lease renewed a day ahead by the node itself: the next honest
	// delegated renewal replaces it; an older one after that does not.
	now := micro(c.clock.Now())
	ahead := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "member-2", Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("member-2"), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: ptr.To(metav1.NewMicroTime(now.Add(24 * time.Hour)))},
	}
	if _, err := c.admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(c.ctx, ahead, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	delegate("member-2", now)
	if got := renewTime("member-2"); !got.Equal(now) {
		t.Fatalf("renewTime %v, want the honest renewal's %v", got, now)
	}
	if n := clamped(clampedStored); n != 1 {
		t.Fatalf("clamped stored_in_future %v, want 1", n)
	}
	delegate("member-2", now.Add(-time.Second))
	if got := renewTime("member-2"); !got.Equal(now) {
		t.Fatalf("an older renewal moved renewTime back to %v", got)
	}
	if got := c.count(tunnel.OK); got != 6 {
		t.Errorf("ok count %v, want 6 (clamps are not refusals)", got)
	}
}

type failingNodes struct{}

func (failingNodes) NodePool(context.Context, string) (string, bool, error) {
	return "", false, fmt.Errorf("node informer not synced yet")
}

// TestLeaseDurationNotTakenFromSender: the leader's delegated heartbeat
// keeps the leaseDurationSeconds the member's kubelet wrote; a Lease
// without one gets the sent one, at most the kubelet's 40 s.
func TestLeaseDurationNotTakenFromSender(t *testing.T) {
	c := newCluster(t)
	renew := micro(c.clock.Now())
	send := func(node string, secs int32) {
		t.Helper()
		var l coordinationv1.Lease
		if err := json.Unmarshal(leaseJSON(t, corev1.NamespaceNodeLease, node, renew), &l); err != nil {
			t.Fatal(err)
		}
		l.Spec.LeaseDurationSeconds = ptr.To(secs)
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		if rep := c.h.Delegate(c.ctx, "leader", tunnel.DelegateRequest{Node: node, Lease: b}); rep.Code != tunnel.OK {
			t.Fatalf("reply %+v, want OK", rep)
		}
	}
	own := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "member-2", Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("member-2"), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: ptr.To(metav1.NewMicroTime(renew.Add(-10 * time.Second)))},
	}
	if _, err := c.admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(c.ctx, own, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	send("member-2", 2000000000)
	if l, err := c.lease("member-2"); err != nil || ptr.Deref(l.Spec.LeaseDurationSeconds, 0) != 40 {
		t.Errorf("member-2's Lease after a delegated heartbeat of 2e9 s: %v %+v; want its own 40 s", err, l)
	}
	send("member", 2000000000) // no Lease yet
	if l, err := c.lease("member"); err != nil || ptr.Deref(l.Spec.LeaseDurationSeconds, 0) != 40 {
		t.Errorf("member's new Lease after a delegated heartbeat of 2e9 s: %v %+v; want 40 s", err, l)
	}
}
