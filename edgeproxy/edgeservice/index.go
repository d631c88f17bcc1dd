package edgeservice

import (
	"maps"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/internal/edgeaccess"
	"github.com/tether-edge/tether/tunnel"
)

// Index maps a marked Service's ClusterIP and port to the Service: what
// the listener asks the gateway for, and what the host's rules redirect.
// It is safe for concurrent use.
type Index struct {
	mu sync.RWMutex
	m  map[netip.AddrPort]tunnel.ServiceRequest
}

// Set replaces the index with the marked ports of svcs, each at every
// ClusterIP of its Service (spec.clusterIPs, else spec.clusterIP), and
// reports whether anything changed.
func (ix *Index) Set(svcs []*corev1.Service) bool {
	m := make(map[netip.AddrPort]tunnel.ServiceRequest)
	for _, svc := range svcs {
		ports := edgeaccess.Ports(svc)
		if len(ports) == 0 {
			continue
		}
		ips := svc.Spec.ClusterIPs
		if len(ips) == 0 {
			ips = []string{svc.Spec.ClusterIP}
		}
		for _, s := range ips {
			ip, err := netip.ParseAddr(s)
			if err != nil {
				continue
			}
			for _, p := range ports {
				m[netip.AddrPortFrom(ip.Unmap(), uint16(p.Port))] = tunnel.ServiceRequest{
					Namespace: svc.Namespace, Name: svc.Name, Port: uint16(p.Port)}
			}
		}
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if maps.Equal(ix.m, m) {
		return false
	}
	ix.m = m
	return true
}

// Lookup returns the Service marked at dst, a ClusterIP and port.
func (ix *Index) Lookup(dst netip.AddrPort) (tunnel.ServiceRequest, bool) {
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	r, ok := ix.m[dst]
	return r, ok
}

// Destinations are the marked ClusterIPs and ports, sorted.
func (ix *Index) Destinations() []netip.AddrPort {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return slices.SortedFunc(maps.Keys(ix.m), func(a, b netip.AddrPort) int { return a.Compare(b) })
}
