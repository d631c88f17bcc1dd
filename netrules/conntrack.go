package netrules

import (
	"cmp"
	"errors"
	"log/slog"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// tracker is what a backend remembers between calls.
type tracker struct {
	log *slog.Logger
	// last is the state the kernel was last made to hold; nil before the
	// first Apply and after Cleanup.
	last *state
	// needFull is set until a full write succeeds, and again after any
	// failure: the kernel is then not trusted to hold last.
	needFull bool
}

// failed records a failed Apply or Cleanup.
func (t *tracker) failed() { t.needFull = true }

// succeeded records that the kernel now holds next (nil: nothing, after
// Cleanup) and flushes the conntrack entries of what last redirected and
// next does not. A failed flush is logged: the rules are right.
func (t *tracker) succeeded(next *state) {
	prev := t.last
	t.last, t.needFull = next, next == nil
	if err := flushConntrack(prev, next); err != nil {
		t.log.Warn("netrules: flush conntrack of removed destinations", "err", err)
	}
}

// flushConntrack deletes the connection tracking entries of TCP
// connections that prev redirected and next no longer redirects the same
// way: to a removed address or port, or all of them when the listener's
// port changed. An entry's NAT binding outlives the rule that made it;
// without the flush, a client's packets on such a connection would keep
// reaching the listener. next may be nil (everything was removed).
func flushConntrack(prev, next *state) error {
	f := newStaleFilter(prev, next)
	if f == nil {
		return nil
	}
	var errs []error
	for _, fam := range []struct {
		af     netlink.InetFamily
		v4     bool
		ipName string
	}{{unix.AF_INET, true, "IPv4"}, {unix.AF_INET6, false, "IPv6"}} {
		if !f.anyFamily(fam.v4) {
			continue
		}
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam.af, f); err != nil {
			errs = append(errs, classify("conntrack: delete "+fam.ipName+" entries", err))
		}
	}
	return errors.Join(errs...)
}

// staleFilter matches the conntrack entries flushConntrack deletes: TCP
// to an address and port prev redirected, where the address or the port
// is no longer redirected (or every one, when the listener's port moved).
type staleFilter struct {
	prev   *state
	all    bool                // every destination prev redirected is stale
	addrs  map[netip.Addr]bool // addresses no longer redirected
	ports  map[uint16]bool     // ports no longer redirected
	v4, v6 bool                // whether anything stale is of that family
}

var _ netlink.CustomConntrackFilter = (*staleFilter)(nil)

// newStaleFilter returns nil if nothing prev redirected is stale.
func newStaleFilter(prev, next *state) *staleFilter {
	if prev == nil || len(prev.ports) == 0 {
		return nil
	}
	f := &staleFilter{prev: prev, addrs: map[netip.Addr]bool{}, ports: map[uint16]bool{}}
	if next == nil || next.proxyPort != prev.proxyPort {
		f.all, f.v4, f.v6 = true, len(prev.v4) > 0, len(prev.v6) > 0
		return f
	}
	_, gone4 := diffSorted(prev.v4, next.v4, netip.Addr.Compare)
	_, gone6 := diffSorted(prev.v6, next.v6, netip.Addr.Compare)
	for _, a := range append(gone4, gone6...) {
		f.addrs[a] = true
	}
	f.v4, f.v6 = len(gone4) > 0, len(gone6) > 0
	_, gonePorts := diffSorted(prev.ports, next.ports, cmp.Compare[uint16])
	for _, p := range gonePorts {
		f.ports[p] = true
		f.v4, f.v6 = f.v4 || len(prev.v4) > 0, f.v6 || len(prev.v6) > 0
	}
	if !f.v4 && !f.v6 {
		return nil
	}
	return f
}

func (f *staleFilter) anyFamily(v4 bool) bool {
	if v4 {
		return f.v4
	}
	return f.v6
}

func (f *staleFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_TCP {
		return false
	}
	a, ok := netip.AddrFromSlice(flow.Forward.DstIP)
	if !ok {
		return false
	}
	a, p := a.Unmap(), flow.Forward.DstPort
	if !f.prev.redirects(a, p) {
		return false
	}
	return f.all || f.addrs[a] || f.ports[p]
}
