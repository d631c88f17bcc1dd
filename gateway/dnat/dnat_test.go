package dnat

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/netrules"
)

var (
	a1 = netip.MustParseAddr("192.168.1.10")
	a2 = netip.MustParseAddr("192.168.2.10")
	c1 = netip.MustParseAddr("10.0.0.5")
)

func snapshot(nodes ...nodewatch.Node) *nodewatch.Snapshot {
	s := &nodewatch.Snapshot{Nodes: map[string]nodewatch.Node{}}
	for _, n := range nodes {
		s.Nodes[n.Name] = n
	}
	return s
}

// start runs a Reconciler until the test ends or stop is called; stop
// waits for Run to return.
func start(t *testing.T, o Options) (r *Reconciler, stop func()) {
	t.Helper()
	r, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return r, stop
}

func TestReconcilerAppliesEdgeNodesOnly(t *testing.T) {
	fake := &netrules.Fake{}
	r, _ := start(t, Options{Rules: fake, Mode: nodewatch.ModeNodeIP, Ports: []uint16{10250, 10255}, ProxyPort: 10263})
	r.Update(snapshot(
		nodewatch.Node{Name: "edge-1", Edge: true, InternalIPs: []netip.Addr{a1}},
		nodewatch.Node{Name: "edge-2", Edge: true, InternalIPs: []netip.Addr{a2}},
		nodewatch.Node{Name: "cloud-1", InternalIPs: []netip.Addr{c1}},
		nodewatch.Node{Name: "edge-noaddr", Edge: true},
	))
	testenv.Eventually(t, "rules applied", r.Ready)
	got, _ := fake.Desired()
	want := netrules.Desired{
		Edges:     map[string][]netip.Addr{"edge-1": {a1}, "edge-2": {a2}},
		Ports:     []uint16{10250, 10255},
		ProxyPort: 10263,
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("desired (-want +got):\n%s", diff)
	}

	// A node removed from the snapshot loses its rules.
	r.Update(snapshot(nodewatch.Node{Name: "edge-2", Edge: true, InternalIPs: []netip.Addr{a2}}))
	testenv.Eventually(t, "edge-1 removed", func() bool {
		d, _ := fake.Desired()
		_, has := d.Edges["edge-1"]
		return !has && len(d.Edges) == 1
	})
}

func TestReconcilerResyncsAndRetries(t *testing.T) {
	fake := &netrules.Fake{}
	clk := clocktesting.NewFakeClock(time.Now())
	fake.SetErr(errors.New("table busy"))
	r, _ := start(t, Options{Rules: fake, Mode: nodewatch.ModeNodeIP, Ports: []uint16{10250}, ProxyPort: 10263, Resync: time.Minute, Clock: clk})
	r.Update(snapshot(nodewatch.Node{Name: "edge-1", Edge: true, InternalIPs: []netip.Addr{a1}}))
	testenv.Eventually(t, "first (failing) apply", func() bool { return fake.Applies() == 1 })
	if r.Ready() {
		t.Fatal("ready after a failed apply")
	}
	// The resync tick retries without a new snapshot.
	fake.SetErr(nil)
	testenv.Eventually(t, "ticker armed", func() bool { return clk.HasWaiters() })
	clk.Step(time.Minute)
	testenv.Eventually(t, "retry on resync", r.Ready)
	n := fake.Applies()
	clk.Step(time.Minute)
	testenv.Eventually(t, "another resync", func() bool { return fake.Applies() > n })
}

func TestReconcilerCleanupOnExit(t *testing.T) {
	for _, cleanup := range []bool{true, false} {
		fake := &netrules.Fake{}
		r, stop := start(t, Options{Rules: fake, Mode: nodewatch.ModeNodeIP, Ports: []uint16{10250}, ProxyPort: 10263, CleanupOnExit: cleanup})
		r.Update(snapshot(nodewatch.Node{Name: "edge-1", Edge: true, InternalIPs: []netip.Addr{a1}}))
		testenv.Eventually(t, "applied", r.Ready)
		stop()
		_, has := fake.Desired()
		if has == cleanup {
			t.Errorf("CleanupOnExit=%v: rules still present = %v", cleanup, has)
		}
	}
}

type fakeLink struct {
	mu    sync.Mutex
	addrs []netip.Addr
}

func (l *fakeLink) Sync(a []netip.Addr) error {
	l.mu.Lock()
	l.addrs = slices.Clone(a)
	l.mu.Unlock()
	return nil
}
func (l *fakeLink) Delete() error { l.mu.Lock(); l.addrs = nil; l.mu.Unlock(); return nil }

type fakePatcher struct {
	mu  sync.Mutex
	set map[string]netip.Addr
}

func (p *fakePatcher) SetVIP(_ context.Context, node string, addr netip.Addr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.set[node] = addr
	return nil
}

func TestVIPModeAssignsRecordsAndHolds(t *testing.T) {
	fake := &netrules.Fake{}
	link := &fakeLink{}
	patcher := &fakePatcher{set: map[string]netip.Addr{}}
	vips := &VIPs{CIDR: netip.MustParsePrefix("100.100.0.0/24"), Link: link, Patcher: patcher}
	r, _ := start(t, Options{Rules: fake, Mode: nodewatch.ModeVIP, Ports: []uint16{10250}, ProxyPort: 10263, VIPs: vips})

	// Two edges on the same private address (sites reuse ranges): neither
	// has a VIP yet, so both get one recorded and no rules exist yet.
	r.Update(snapshot(
		nodewatch.Node{Name: "edge-1", Edge: true, InternalIPs: []netip.Addr{a1}},
		nodewatch.Node{Name: "edge-2", Edge: true, InternalIPs: []netip.Addr{a1}},
	))
	testenv.Eventually(t, "VIPs recorded", func() bool { patcher.mu.Lock(); defer patcher.mu.Unlock(); return len(patcher.set) == 2 })
	v1, v2 := patcher.set["edge-1"], patcher.set["edge-2"]
	if v1 == v2 || !vips.CIDR.Contains(v1) || !vips.CIDR.Contains(v2) {
		t.Fatalf("VIPs %v and %v: want two distinct addresses in %v", v1, v2, vips.CIDR)
	}

	// The annotations come back through the watcher: the link holds them
	// and the rules redirect them.
	r.Update(snapshot(
		nodewatch.Node{Name: "edge-1", Edge: true, InternalIPs: []netip.Addr{a1}, VIP: v1},
		nodewatch.Node{Name: "edge-2", Edge: true, InternalIPs: []netip.Addr{a1}, VIP: v2},
	))
	testenv.Eventually(t, "rules for VIPs", func() bool {
		d, _ := fake.Desired()
		return len(d.Edges) == 2 && d.Edges["edge-1"][0] == v1 && d.Edges["edge-2"][0] == v2
	})
	link.mu.Lock()
	held := slices.Clone(link.addrs)
	link.mu.Unlock()
	slices.SortFunc(held, netip.Addr.Compare)
	want := []netip.Addr{v1, v2}
	slices.SortFunc(want, netip.Addr.Compare)
	if !slices.Equal(held, want) {
		t.Errorf("link holds %v, want %v", held, want)
	}
}

// recordingRules is a netrules.Fake that records the order of calls.
type recordingRules struct {
	*netrules.Fake
	mu    sync.Mutex
	calls []string
}

func (r *recordingRules) record(call string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call)
}

func (r *recordingRules) Apply(ctx context.Context, d netrules.Desired) error {
	err := r.Fake.Apply(ctx, d)
	if err != nil {
		r.record("apply failed")
		return err
	}
	r.record("apply")
	return nil
}

func (r *recordingRules) FlushConntrack(ctx context.Context) error {
	r.record("flush")
	return r.Fake.FlushConntrack(ctx)
}

func (r *recordingRules) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// TestReconcilerFlushesConntrackAfterApply checks that the conntrack
// entries of what the rules stopped redirecting are flushed after every
// successful Apply (netrules.Rules leaves it out of Apply), never after a
// failed one.
func TestReconcilerFlushesConntrackAfterApply(t *testing.T) {
	rules := &recordingRules{Fake: &netrules.Fake{}}
	r, _ := start(t, Options{Rules: rules, Mode: nodewatch.ModeNodeIP, Ports: []uint16{10250}, ProxyPort: 10263})
	both := snapshot(
		nodewatch.Node{Name: "edge-1", Edge: true, InternalIPs: []netip.Addr{a1}},
		nodewatch.Node{Name: "edge-2", Edge: true, InternalIPs: []netip.Addr{a2}},
	)
	one := snapshot(nodewatch.Node{Name: "edge-2", Edge: true, InternalIPs: []netip.Addr{a2}})
	steps := []struct {
		err  error
		snap *nodewatch.Snapshot
		want []string
	}{
		{nil, both, []string{"apply", "flush"}},
		{errors.New("table busy"), one, []string{"apply failed"}},
		{nil, one, []string{"apply", "flush"}},
	}
	var want []string
	for _, s := range steps {
		rules.SetErr(s.err)
		r.Update(s.snap)
		want = append(want, s.want...)
		testenv.Eventually(t, fmt.Sprintf("calls %v", want), func() bool { return len(rules.Calls()) >= len(want) })
	}
	if diff := cmp.Diff(want, rules.Calls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

// TestRulesOnlyForRoutedAddresses: the rules redirect what the snapshot's
// Routes give each edge and nothing they refuse: not a cloud node's address
// an edge claims, not an address two edges claim with no first holder.
func TestRulesOnlyForRoutedAddresses(t *testing.T) {
	fake := &netrules.Fake{}
	r, _ := start(t, Options{Rules: fake, Mode: nodewatch.ModeNodeIP, Ports: []uint16{10250}, ProxyPort: 10263})
	r.Update(snapshot(
		nodewatch.Node{Name: "edge-1", Edge: true, InternalIPs: []netip.Addr{a1}},
		nodewatch.Node{Name: "edge-2", Edge: true, InternalIPs: []netip.Addr{a1}},
		nodewatch.Node{Name: "edge-3", Edge: true, InternalIPs: []netip.Addr{a2, c1}},
		nodewatch.Node{Name: "cloud-1", InternalIPs: []netip.Addr{c1}},
	))
	testenv.Eventually(t, "rules applied", func() bool { _, ok := fake.Desired(); return ok })
	d, _ := fake.Desired()
	want := map[string][]netip.Addr{"edge-3": {a2}}
	if !maps.EqualFunc(d.Edges, want, slices.Equal) {
		t.Errorf("rules for %v, want %v", d.Edges, want)
	}
}

// TestVIPForgedAnnotationReplaced: an edge that writes another edge's VIP
// on itself does not get it: the first holder keeps the VIP and its rules,
// and the forger is assigned an address of its own, which overwrites its
// annotation.
func TestVIPForgedAnnotationReplaced(t *testing.T) {
	fake := &netrules.Fake{}
	link := &fakeLink{}
	patcher := &fakePatcher{set: map[string]netip.Addr{}}
	cidr := netip.MustParsePrefix("100.100.0.0/24")
	vips := &VIPs{CIDR: cidr, Link: link, Patcher: patcher}
	r, _ := start(t, Options{Rules: fake, Mode: nodewatch.ModeVIP, Ports: []uint16{10250}, ProxyPort: 10263, VIPs: vips})
	policy := nodewatch.Policy{Mode: nodewatch.ModeVIP, VIPCIDR: cidr}
	v1 := netip.MustParseAddr("100.100.0.7")
	honest := nodewatch.Node{Name: "edge-b", Edge: true, InternalIPs: []netip.Addr{a1}, VIP: v1}
	first := snapshot(honest)
	first.Routes = nodewatch.Resolve(first.Nodes, policy, nil, nil)
	// The forger sorts first: name order would hand it v1.
	second := snapshot(honest, nodewatch.Node{Name: "edge-a", Edge: true, InternalIPs: []netip.Addr{a2}, VIP: v1})
	second.Routes = nodewatch.Resolve(second.Nodes, policy, nil, first.Routes)
	r.Update(second)

	testenv.Eventually(t, "a VIP of its own recorded for the forger", func() bool {
		patcher.mu.Lock()
		defer patcher.mu.Unlock()
		return patcher.set["edge-a"].IsValid()
	})
	patcher.mu.Lock()
	defer patcher.mu.Unlock()
	if got := patcher.set["edge-a"]; got == v1 || !cidr.Contains(got) {
		t.Errorf("forger assigned %v", got)
	}
	if _, ok := patcher.set["edge-b"]; ok {
		t.Errorf("the first holder's VIP was rewritten to %v", patcher.set["edge-b"])
	}
	testenv.Eventually(t, "rules applied", func() bool { _, ok := fake.Desired(); return ok })
	d, _ := fake.Desired()
	if want := map[string][]netip.Addr{"edge-b": {v1}}; !maps.EqualFunc(d.Edges, want, slices.Equal) {
		t.Errorf("rules for %v, want %v", d.Edges, want)
	}
}

// TestRulesForRoutedPodRanges: the pod ranges the snapshot routes are
// redirected, on every port, and nothing of a refused range.
func TestRulesForRoutedPodRanges(t *testing.T) {
	fake := &netrules.Fake{}
	r, _ := start(t, Options{Rules: fake, Mode: nodewatch.ModeNodeIP, Ports: []uint16{10250}, ProxyPort: 10263})
	s := snapshot(
		nodewatch.Node{Name: "edge-1", Edge: true, InternalIPs: []netip.Addr{a1}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}},
		nodewatch.Node{Name: "edge-2", Edge: true, InternalIPs: []netip.Addr{a2}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}},
		nodewatch.Node{Name: "cloud-1", InternalIPs: []netip.Addr{c1}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}},
	)
	s.Pods = nodewatch.ResolvePods(s.Nodes, nodewatch.PodPolicy{Ranges: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}, nil, nil)
	r.Update(s)
	testenv.Eventually(t, "rules applied", func() bool { _, ok := fake.Desired(); return ok })
	d, _ := fake.Desired()
	want := map[string][]netip.Prefix{"edge-1": {netip.MustParsePrefix("10.244.1.0/24")}}
	if !maps.EqualFunc(d.PodRanges, want, slices.Equal) {
		t.Errorf("pod ranges %v, want only edge-1's (edge-2's overlaps a cloud node's)", d.PodRanges)
	}
	for _, tc := range []struct {
		dst        string
		redirected bool
	}{{"10.244.1.7:9100", true}, {"10.244.1.7:22", true}, {"10.244.0.7:9100", false}} {
		if _, got := fake.Trace(netip.MustParseAddrPort(tc.dst)); got != tc.redirected {
			t.Errorf("%s redirected: %v, want %v", tc.dst, got, tc.redirected)
		}
	}
}
