package edgetunnel

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// AddrSource lists the node's own addresses.
type AddrSource interface {
	Addrs() ([]netip.Addr, error)
}

// InterfaceAddrs is the AddrSource of the host's network interfaces.
type InterfaceAddrs struct{}

var _ AddrSource = InterfaceAddrs{}

func (InterfaceAddrs) Addrs() ([]netip.Addr, error) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list interface addresses: %w", err)
	}
	var out []netip.Addr
	for _, ifa := range ifas {
		if n, ok := ifa.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out, nil
}

const (
	// addrsMaxAge: the node's addresses are re-read at least this often.
	addrsMaxAge = 30 * time.Second
	// addrsMinAge: a destination not in the list re-reads the addresses
	// (an address added a moment ago is allowed at once), but no more
	// often than this, so refused requests cannot make us spin.
	addrsMinAge = time.Second
)

// allowList decides which destinations the edge dials: the node's own
// addresses and loopback, on the allowed ports only.
type allowList struct {
	ports []uint16
	src   AddrSource
	clock clock.PassiveClock
	log   *slog.Logger

	mu      sync.Mutex
	addrs   map[netip.Addr]bool
	fetched time.Time
}

// check returns "" when dest is allowed, and otherwise why not.
func (a *allowList) check(dest netip.AddrPort) string {
	if !slices.Contains(a.ports, dest.Port()) {
		return fmt.Sprintf("port %d is not in --allow-ports", dest.Port())
	}
	addr := dest.Addr().Unmap().WithZone("")
	if addr.IsLoopback() || a.isLocal(addr) {
		return ""
	}
	return fmt.Sprintf("%s is not an address of this node", addr)
}

func (a *allowList) isLocal(addr netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	age := a.clock.Since(a.fetched)
	if a.addrs == nil || age >= addrsMaxAge || (!a.addrs[addr] && age >= addrsMinAge) {
		a.refresh()
	}
	return a.addrs[addr]
}

// refresh re-reads the addresses; on failure it keeps the old ones.
func (a *allowList) refresh() {
	a.fetched = a.clock.Now()
	list, err := a.src.Addrs()
	if err != nil {
		a.log.Warn("cannot read the node's addresses; keeping the previous list", "err", err)
		if a.addrs == nil {
			a.addrs = map[netip.Addr]bool{}
		}
		return
	}
	m := make(map[netip.Addr]bool, len(list))
	for _, ad := range list {
		m[ad.Unmap().WithZone("")] = true
	}
	a.addrs = m
}
