package netrules

import (
	"cmp"
	"errors"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// maxStale bounds the states a tracker keeps for the next conntrack flush.
// A caller that flushes after every Apply keeps at most one; one that
// never does gets its flush done inside Apply when this many pile up, so
// that memory stays bounded and entries still go, late.
const maxStale = 16

// tracker is what a backend remembers between calls.
type tracker struct {
	log *slog.Logger
	// last is the state the kernel was last made to hold; nil before the
	// first Apply and after Cleanup.
	last *state
	// needFull is set until a full write succeeds, and again after any
	// failure: the kernel is then not trusted to hold last.
	needFull bool
	// stale holds the states the kernel held since the last conntrack
	// flush that a later state stopped redirecting something of: the
	// connections they redirected to destinations last does not redirect
	// the same way are what the next flush deletes. States are never
	// modified once made, so keeping them costs no copy.
	stale []*state
}

// failed records a failed Apply or Cleanup.
func (t *tracker) failed() { t.needFull = true }

// succeeded records that the kernel now holds next (nil: nothing, after
// Cleanup), and remembers the previous state for the next conntrack flush
// if next stopped redirecting some of it.
func (t *tracker) succeeded(next *state) {
	prev := t.last
	t.last, t.needFull = next, next == nil
	if prev == nil {
		return
	}
	if v4, v6 := staleFamilies([]*state{prev}, next); v4 || v6 {
		t.stale = append(t.stale, prev)
	}
	if len(t.stale) >= maxStale {
		t.log.Debug("netrules: conntrack not flushed since many changes; flushing now", "changes", len(t.stale))
		t.flushLogged()
	}
}

// flushConntrack deletes the connection tracking entries of TCP
// connections that a state in t.stale redirected to its listener and that
// t.last does not redirect to the same listener: to a removed address or
// port, or any of them when the listener's port changed. An entry's NAT
// binding outlives the rule that made it; without the flush, a client's
// packets on such a connection would keep reaching the listener. t.stale
// is emptied whatever happens: a flush that failed is not retried.
func (t *tracker) flushConntrack() error {
	f := newStaleFilter(t.stale, t.last)
	t.stale = nil
	if f == nil {
		return nil
	}
	var errs []error
	for _, fam := range []struct {
		af     netlink.InetFamily
		v4     bool
		ipName string
	}{{unix.AF_INET, true, "IPv4"}, {unix.AF_INET6, false, "IPv6"}} {
		if (fam.v4 && !f.v4) || (!fam.v4 && !f.v6) {
			continue
		}
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam.af, f); err != nil {
			errs = append(errs, classify("conntrack: delete "+fam.ipName+" entries", err))
		}
	}
	return errors.Join(errs...)
}

// flushLogged flushes and logs a failure: the rules are right either way.
func (t *tracker) flushLogged() {
	if err := t.flushConntrack(); err != nil {
		t.log.Warn("netrules: flush conntrack of removed destinations", "err", err)
	}
}

// staleFilter matches the conntrack entries flushConntrack deletes: TCP to
// an address and port that a stale state redirected (an edge address on a
// proxied port, or any port of an address in a pod range), whose reply comes
// from that state's listener port (the connection was redirected, not
// direct), unless cur redirects it to the same listener still.
type staleFilter struct {
	stale  []*state
	cur    *state // nil: nothing is redirected now
	v4, v6 bool   // whether anything stale is of that family
}

var _ netlink.CustomConntrackFilter = (*staleFilter)(nil)

// newStaleFilter returns nil if nothing the stale states redirected is
// stale with cur in place.
func newStaleFilter(stale []*state, cur *state) *staleFilter {
	v4, v6 := staleFamilies(stale, cur)
	if !v4 && !v6 {
		return nil
	}
	return &staleFilter{stale: stale, cur: cur, v4: v4, v6: v6}
}

// staleFamilies reports, per family, whether some state in stale
// redirects a destination that cur does not redirect to the same listener.
// It may answer true for a family where nothing is (a pod range split in
// two, an address removed that a pod range holds): the filter then matches
// nothing there.
func staleFamilies(stale []*state, cur *state) (v4, v6 bool) {
	for _, s := range stale {
		if cur == nil || cur.proxyPort != s.proxyPort {
			v4 = v4 || len(s.pods4) > 0 || (len(s.v4) > 0 && len(s.ports) > 0)
			v6 = v6 || len(s.pods6) > 0 || (len(s.v6) > 0 && len(s.ports) > 0)
			continue
		}
		v4 = v4 || slices.ContainsFunc(s.pods4, func(p netip.Prefix) bool { return !cur.holdsRange(p) })
		v6 = v6 || slices.ContainsFunc(s.pods6, func(p netip.Prefix) bool { return !cur.holdsRange(p) })
		if len(s.ports) == 0 {
			continue
		}
		if _, gone := diffSorted(s.ports, cur.ports, cmp.Compare[uint16]); len(gone) > 0 {
			v4, v6 = v4 || len(s.v4) > 0, v6 || len(s.v6) > 0
			continue
		}
		_, gone4 := diffSorted(s.v4, cur.v4, netip.Addr.Compare)
		_, gone6 := diffSorted(s.v6, cur.v6, netip.Addr.Compare)
		v4, v6 = v4 || len(gone4) > 0, v6 || len(gone6) > 0
	}
	return v4, v6
}

func (f *staleFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_TCP {
		return false
	}
	a, ok := netip.AddrFromSlice(flow.Forward.DstIP)
	if !ok {
		return false
	}
	a, p, listener := a.Unmap(), flow.Forward.DstPort, flow.Reverse.SrcPort
	if f.cur != nil && f.cur.proxyPort == listener && f.cur.redirects(a, p) {
		return false
	}
	for _, s := range f.stale {
		if s.proxyPort == listener && s.redirects(a, p) {
			return true
		}
	}
	return false
}
