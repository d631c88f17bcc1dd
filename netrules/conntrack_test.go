package netrules

import (
	"context"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"testing"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// flow is a conntrack entry of a connection to dst whose replies come
// from port replyPort: the listener's port if it was redirected, dst's own
// if not.
func flow(proto uint8, dst string, replyPort uint16) *netlink.ConntrackFlow {
	ap := netip.MustParseAddrPort(dst)
	f := &netlink.ConntrackFlow{}
	f.Forward.Protocol = proto
	f.Forward.DstIP = net.IP(ap.Addr().AsSlice())
	f.Forward.DstPort = ap.Port()
	f.Reverse.Protocol = proto
	f.Reverse.SrcPort = replyPort
	return f
}

func TestStaleFilter(t *testing.T) {
	prev := mustNormalize(t, goldenDesired)
	removedNode := goldenDesired
	removedNode.Edges = map[string][]netip.Addr{"edge-b": goldenDesired.Edges["edge-b"]}
	removedPort := goldenDesired
	removedPort.Ports = []uint16{10250, 10255}
	movedListener := goldenDesired
	movedListener.ProxyPort = 10264
	// edge-a's and edge-c's 10.244.1.0/24 and edge-a's IPv6 range go;
	// edge-b's 10.244.2.0/24 goes, but edge-d's 10.244.2.64/26 inside
	// it stays.
	removedRanges := goldenDesired
	removedRanges.PodRanges = maps.Clone(goldenDesired.PodRanges)
	for _, n := range []string{"edge-a", "edge-b", "edge-c"} {
		delete(removedRanges.PodRanges, n)
	}

	type dst struct {
		addr      string
		replyPort uint16
	}
	for _, tc := range []struct {
		name  string
		next  Desired
		stale map[dst]bool // flow -> deleted
	}{
		{"node removed", removedNode, map[dst]bool{
			{"10.20.0.5:10250", 10263}:    true,
			{"[fd00:20::5]:8080", 10263}:  true,
			{"192.168.7.10:10255", 10263}: true,
			{"10.20.0.6:10250", 10263}:    false, // still redirected
			{"10.20.0.5:10251", 10263}:    false, // never redirected
			{"10.30.0.1:10250", 10263}:    false, // never an edge
			{"10.20.0.5:10250", 10250}:    false, // direct, not redirected
		}},
		{"port removed", removedPort, map[dst]bool{
			{"10.20.0.5:8080", 10263}:  true,
			{"10.20.0.5:10250", 10263}: false,
			{"10.20.0.5:8080", 8080}:   false,
		}},
		{"listener moved", movedListener, map[dst]bool{
			{"10.20.0.5:10250", 10263}: true,
			{"10.20.0.5:10250", 10264}: false, // redirected by next
			{"10.20.0.5:10251", 10263}: false,
			{"10.244.5.7:9100", 10263}: true,
			{"10.244.5.7:9100", 10264}: false,
		}},
		{"pod ranges removed", removedRanges, map[dst]bool{
			{"10.244.1.7:9100", 10263}:      true,
			{"10.244.1.7:443", 10263}:       true,
			{"[fd00:244:0:1::9]:80", 10263}: true,
			{"10.244.2.1:9100", 10263}:      true,
			{"10.244.2.65:9100", 10263}:     false, // edge-d's range stays
			{"10.244.5.7:9100", 10263}:      false, // edge-f's stays
			{"[fd00:244:0:3::9]:80", 10263}: false,
			{"10.244.1.7:9100", 9100}:       false, // direct, not redirected
			{"10.244.4.7:9100", 10263}:      false, // never a pod range
			{"10.20.0.5:10250", 10263}:      false, // edge addresses unchanged
		}},
	} {
		f := newStaleFilter([]*state{prev}, mustNormalize(t, tc.next))
		if f == nil {
			t.Errorf("%s: nothing stale", tc.name)
			continue
		}
		for d, want := range tc.stale {
			if got := f.MatchConntrackFlow(flow(unix.IPPROTO_TCP, d.addr, d.replyPort)); got != want {
				t.Errorf("%s: TCP to %s, replies from port %d: stale %v, want %v", tc.name, d.addr, d.replyPort, got, want)
			}
			if f.MatchConntrackFlow(flow(unix.IPPROTO_UDP, d.addr, d.replyPort)) {
				t.Errorf("%s: UDP to %s matched", tc.name, d.addr)
			}
		}
	}
	if f := newStaleFilter([]*state{prev}, prev); f != nil {
		t.Errorf("same state: filter %+v, want none", f)
	}
	added := goldenDesired
	added.Edges = map[string][]netip.Addr{"new": {netip.MustParseAddr("10.1.1.1")}}
	maps.Copy(added.Edges, goldenDesired.Edges)
	if f := newStaleFilter([]*state{prev}, mustNormalize(t, added)); f != nil {
		t.Errorf("node added: filter %+v, want none", f)
	}
	if f := newStaleFilter([]*state{prev}, nil); f == nil || !f.v4 || !f.v6 {
		t.Errorf("cleanup: filter %+v, want all of both families", f)
	}
	if f := newStaleFilter(nil, prev); f != nil {
		t.Errorf("nothing recorded: filter %+v, want none", f)
	}

	// A range that grows over the old one, or is split into ranges that
	// cover it, leaves nothing stale to match.
	pfx := netip.MustParsePrefix
	narrow := mustNormalize(t, Desired{ProxyPort: 10263, PodRanges: map[string][]netip.Prefix{"n": {pfx("10.244.2.0/24")}}})
	wide := mustNormalize(t, Desired{ProxyPort: 10263, PodRanges: map[string][]netip.Prefix{"n": {pfx("10.244.0.0/16")}}})
	if f := newStaleFilter([]*state{narrow}, wide); f != nil {
		t.Errorf("pod range widened: filter %+v, want none", f)
	}
	split := mustNormalize(t, Desired{ProxyPort: 10263, PodRanges: map[string][]netip.Prefix{
		"n": {pfx("10.244.2.0/25")}, "m": {pfx("10.244.2.128/25")},
	}})
	if f := newStaleFilter([]*state{narrow}, split); f != nil && f.MatchConntrackFlow(flow(unix.IPPROTO_TCP, "10.244.2.200:80", 10263)) {
		t.Error("pod range split in two: a flow both halves redirect matched")
	}
	// Pod ranges without proxied ports are flushed too (no ports: the
	// edge addresses redirect nothing).
	if f := newStaleFilter([]*state{wide}, nil); f == nil || !f.v4 || f.v6 {
		t.Errorf("pod ranges only, cleanup: filter %+v, want IPv4 only", f)
	} else if !f.MatchConntrackFlow(flow(unix.IPPROTO_TCP, "10.244.7.1:22", 10263)) {
		t.Error("pod ranges only, cleanup: a redirected flow did not match")
	}
	if f := newStaleFilter([]*state{wide}, narrow); f == nil {
		t.Error("pod range narrowed: nothing stale")
	} else if !f.MatchConntrackFlow(flow(unix.IPPROTO_TCP, "10.244.7.1:22", 10263)) ||
		f.MatchConntrackFlow(flow(unix.IPPROTO_TCP, "10.244.2.1:22", 10263)) {
		t.Error("pod range narrowed: wrong flows matched")
	}
}

// TestTrackerRecordsStale checks what Applies leave for the next flush:
// only states that a later one stopped redirecting something of, judged
// against the state in place when the flush runs.
func TestTrackerRecordsStale(t *testing.T) {
	all := mustNormalize(t, goldenDesired)
	lessD := goldenDesired
	lessD.Edges = maps.Clone(goldenDesired.Edges)
	delete(lessD.Edges, "edge-a") // 10.20.0.5, fd00:20::5
	less := mustNormalize(t, lessD)
	lessAgainD := lessD
	lessAgainD.Edges = maps.Clone(lessD.Edges)
	delete(lessAgainD.Edges, "edge-b") // 10.20.0.6, also claimed by edge-f
	delete(lessAgainD.Edges, "edge-f")
	lessAgain := mustNormalize(t, lessAgainD)

	tr := tracker{log: slog.New(slog.DiscardHandler)}
	tr.succeeded(less)
	tr.succeeded(all) // adds only
	tr.succeeded(all) // the resync timer
	if len(tr.stale) != 0 {
		t.Fatalf("after adds only: %d stale states, want 0", len(tr.stale))
	}

	// Removed, then back before the flush: nothing to flush.
	tr.succeeded(less)
	tr.succeeded(all)
	if f := newStaleFilter(tr.stale, tr.last); f != nil {
		t.Errorf("edge-a removed and back: filter over %d states, want none", len(f.stale))
	}

	// Two removals before one flush: the flush covers both.
	tr.stale = nil
	tr.succeeded(less)
	tr.succeeded(lessAgain)
	f := newStaleFilter(tr.stale, tr.last)
	if f == nil {
		t.Fatal("two removals: nothing stale")
	}
	for d, want := range map[string]bool{
		"10.20.0.5:10250":    true,
		"[fd00:20::5]:10255": true,
		"10.20.0.6:8080":     true,
		"10.20.0.17:10250":   false,
	} {
		if got := f.MatchConntrackFlow(flow(unix.IPPROTO_TCP, d, 10263)); got != want {
			t.Errorf("two removals: TCP to %s: stale %v, want %v", d, got, want)
		}
	}
}

// TestKernelConntrackFlushedWithoutCaller checks that a caller that never
// calls FlushConntrack gets it done inside Apply, so that what is kept for
// the flush stays bounded.
func TestKernelConntrackFlushedWithoutCaller(t *testing.T) {
	testenv.RequireRoot(t)
	h := testenv.NewHost(t, "nr-ctcap")
	ctx := context.Background()
	lessD := goldenDesired
	lessD.Edges = maps.Clone(goldenDesired.Edges)
	delete(lessD.Edges, "edge-a")
	err := h.Do(func() error {
		r, err := newNFTRules(testLogger(t))
		if err != nil {
			return err
		}
		for i := range maxStale {
			if err := r.Apply(ctx, goldenDesired); err != nil {
				return err
			}
			if err := r.Apply(ctx, lessD); err != nil {
				return err
			}
			if want := (i + 1) % maxStale; len(r.stale) != want {
				t.Errorf("after %d removals: %d states kept for the flush, want %d", i+1, len(r.stale), want)
			}
		}
		return r.Cleanup(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
}
