// Package vip gives edge nodes virtual addresses for the gateway's vip mode,
// where sites may reuse the same private ranges and clients reach each edge
// node through an address of its own from --vip-cidr.
//
// Assign is the pure allocation: given the CIDR, the edge nodes and the
// addresses already recorded on them (the Node annotation tether.io/vip,
// which the gateway writes so that every replica agrees), it returns every
// node's VIP. Link keeps those addresses on the dummy interface tether0, so
// that they are local addresses of the gateway host and netrules can
// redirect them.
package vip

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
)

// Annotation is the Node annotation holding a node's VIP.
const Annotation = "tether.io/vip"

// ErrExhausted is returned (wrapped) by Assign when the CIDR has no free
// address left for some node.
var ErrExhausted = errors.New("vip: no free address left in the CIDR")

// Assign returns a VIP from cidr for every node in nodes.
//
//   - Stable: a node keeps its recorded address if it is usable (inside
//     cidr, not the network, broadcast or IPv6 subnet-router address) and
//     no node with a smaller name records the same one.
//   - Deterministic: a node without one gets the first free address at or
//     after an offset hashed from its name (FNV-1a, wrapping around), so
//     replicas that have not yet seen each other's annotations compute the
//     same answer, and a node's address does not depend on the order nodes
//     were added. Nodes are placed in name order.
//   - No collisions: every returned address is distinct.
//
// Recorded addresses of nodes not in nodes are ignored (those nodes are
// gone; their addresses are free). If the CIDR runs out, Assign returns
// the nodes it could place and an error wrapping ErrExhausted that names
// the others.
func Assign(cidr netip.Prefix, nodes []string, recorded map[string]netip.Addr) (map[string]netip.Addr, error) {
	if !cidr.IsValid() {
		return nil, fmt.Errorf("vip: invalid CIDR %v", cidr)
	}
	p := pool{prefix: cidr.Masked()}
	names := slices.Clone(nodes)
	slices.Sort(names)
	names = slices.Compact(names)

	out := make(map[string]netip.Addr, len(names))
	taken := make(map[netip.Addr]bool, len(names))
	var pending []string
	for _, n := range names {
		a, ok := recorded[n]
		if ok {
			a = a.Unmap()
		}
		if ok && p.usable(a) && !taken[a] {
			out[n], taken[a] = a, true
			continue
		}
		pending = append(pending, n)
	}
	var left []string
	for _, n := range pending {
		if p.full(len(taken)) {
			left = append(left, n)
			continue
		}
		off := hash(n)
		for {
			a := p.at(off)
			if p.usable(a) && !taken[a] {
				out[n], taken[a] = a, true
				break
			}
			off++
		}
	}
	if len(left) > 0 {
		return out, fmt.Errorf("%w: %v (%d addresses in use)", ErrExhausted, left, len(taken))
	}
	return out, nil
}

// pool is the address space of a CIDR.
type pool struct{ prefix netip.Prefix }

func (p pool) hostBits() int { return p.prefix.Addr().BitLen() - p.prefix.Bits() }

// at returns the address at offset off (modulo the pool's size) in the
// pool. Beyond 64 host bits only the low 64 are used.
func (p pool) at(off uint64) netip.Addr {
	if hb := p.hostBits(); hb < 64 {
		off &= 1<<hb - 1
	}
	b := p.prefix.Addr().As16()
	for i := 15; i >= 8; i-- {
		b[i] |= byte(off)
		off >>= 8
	}
	a := netip.AddrFrom16(b)
	if p.prefix.Addr().Is4() {
		return a.Unmap()
	}
	return a
}

// usable reports whether a is in the pool and not reserved: the network
// and broadcast addresses of IPv4 subnets larger than /31, the
// subnet-router anycast address (the first) of IPv6 subnets larger than
// /127.
func (p pool) usable(a netip.Addr) bool {
	if !p.prefix.Contains(a) {
		return false
	}
	hb := p.hostBits()
	first := a == p.prefix.Addr()
	if a.Is4() {
		return hb < 2 || (!first && a != p.at(1<<hb-1))
	}
	return hb < 1 || !first
}

// full reports whether n taken addresses use up the pool.
func (p pool) full(n int) bool {
	hb := p.hostBits()
	if hb >= 62 {
		return false
	}
	size := 1 << hb
	switch {
	case p.prefix.Addr().Is4() && hb >= 2:
		size -= 2
	case p.prefix.Addr().Is6() && hb >= 1:
		size--
	}
	return n >= size
}

func hash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}
