package netrules

// The nftables ruleset, as data. The table and its chains and rules are
// static (only the listener's port appears in a rule); what changes is in
// five sets: edge addresses and pod ranges, per family, and ports. Everything here renders two ways: as netlink objects for
// github.com/google/nftables, and as the text `nft list table inet tether`
// prints for it (nft 1.0.6), which the golden tests compare.

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

const (
	// nftTableName is Tether's table, in family inet (IPv4 and IPv6).
	nftTableName = "tether"
	// marker starts every comment Tether writes, in nftables and in
	// iptables. A table or chain of Tether's name whose contents carry no
	// such comment belongs to someone else (ErrConflict).
	marker = "tether:"
)

var nftTable = &nftables.Table{Name: nftTableName, Family: nftables.TableFamilyINet}

// nftSetSpec is one set of the table.
type nftSetSpec struct {
	id      uint32 // batch-local ID, so rules can refer to a set made in the same batch
	name    string
	keyType nftables.SetDatatype
	// interval: the set holds ranges of addresses (flags interval); see
	// rangeKeys.
	interval bool
	comment  string
}

var (
	setEdges4 = nftSetSpec{1, "edges4", nftables.TypeIPAddr, false, marker + " IPv4 addresses of edge nodes"}
	setEdges6 = nftSetSpec{2, "edges6", nftables.TypeIP6Addr, false, marker + " IPv6 addresses of edge nodes"}
	setPorts  = nftSetSpec{3, "ports", nftables.TypeInetService, false, marker + " proxied TCP ports"}
	setPods4  = nftSetSpec{4, "pods4", nftables.TypeIPAddr, true, marker + " IPv4 pod ranges of edge nodes"}
	setPods6  = nftSetSpec{5, "pods6", nftables.TypeIP6Addr, true, marker + " IPv6 pod ranges of edge nodes"}
	nftSets   = []nftSetSpec{setEdges4, setEdges6, setPorts, setPods4, setPods6}
)

func (s nftSetSpec) set() *nftables.Set {
	return &nftables.Set{Table: nftTable, ID: s.id, Name: s.name, KeyType: s.keyType, Interval: s.interval, Comment: s.comment}
}

// elements returns the set's elements for state st: for the plain sets,
// keys in nft's listing order (ascending); for the interval sets, the
// keys of rangeKeys.
func (s nftSetSpec) elements(st *state) [][]byte {
	switch s.name {
	case setEdges4.name:
		return addrKeys(st.v4, 4)
	case setEdges6.name:
		return addrKeys(st.v6, 16)
	case setPods4.name:
		return rangeKeys(st.pods4)
	case setPods6.name:
		return rangeKeys(st.pods6)
	}
	return portKeys(st.ports)
}

// texts returns the set's elements for state st as nft lists them,
// ascending: an interval of one address as the address, one that is a
// prefix as the prefix, any other as first-last.
func (s nftSetSpec) texts(st *state) []string {
	var out []string
	if s.interval {
		for _, iv := range mergeRanges(st.pods(s.family())) {
			out = append(out, iv.String())
		}
		return out
	}
	for _, k := range s.elements(st) {
		out = append(out, s.elementText(k))
	}
	return out
}

// family returns 4 or 6 for an address set.
func (s nftSetSpec) family() int {
	if s.keyType.Name == nftables.TypeIPAddr.Name {
		return 4
	}
	return 6
}

// Interval elements are compared, like the others, as byte strings: the
// key followed by one flag byte.
const (
	rangeStart byte = 0
	rangeEnd   byte = 1 // NFT_SET_ELEM_INTERVAL_END
)

// addrInterval is the addresses from first to last, both included.
type addrInterval struct{ first, last netip.Addr }

// String spells iv as nft lists an interval set's element.
func (iv addrInterval) String() string {
	if iv.first == iv.last {
		return iv.first.String()
	}
	for bits := iv.first.BitLen() - 1; bits > 0; bits-- {
		p := netip.PrefixFrom(iv.first, bits)
		if p.Masked().Addr() != iv.first {
			break
		}
		if lastAddr(p) == iv.last {
			return p.String()
		}
	}
	return iv.first.String() + "-" + iv.last.String()
}

// mergeRanges returns sorted, disjoint ranges as the intervals they
// cover, adjacent ranges joined into one (as nft's auto-merge does).
//
// The interval sets hold merged intervals because the kernel's rbtree set
// (6.18 here) fails to find an element to delete, in some orders, when an
// interval's end and the next interval's start share an address
// (ENOENT on the batch): with ranges merged, no two elements of a set
// ever have the same address.
func mergeRanges(ranges []netip.Prefix) []addrInterval {
	out := make([]addrInterval, 0, len(ranges))
	for _, p := range ranges {
		last := lastAddr(p)
		if n := len(out); n > 0 && out[n-1].last.Next() == p.Addr() {
			out[n-1].last = last
			continue
		}
		out = append(out, addrInterval{p.Addr(), last})
	}
	return out
}

// rangeKeys returns the elements of an interval set holding ranges
// (sorted and disjoint), as keys with a trailing flag byte: per merged
// interval (mergeRanges), its first address (rangeStart), and the first
// address after it (rangeEnd), if there is one. An interval that ends at
// the family's last address has no end element: the kernel then matches
// everything from its start. The keys are sorted, as byte strings.
func rangeKeys(ranges []netip.Prefix) [][]byte {
	if len(ranges) == 0 {
		return nil
	}
	size := ranges[0].Addr().BitLen()/8 + 1
	ivs := mergeRanges(ranges)
	buf := make([]byte, 0, 2*size*len(ivs))
	keys := make([][]byte, 0, 2*len(ivs))
	add := func(a netip.Addr, flag byte) {
		start := len(buf)
		if a.Is4() {
			b := a.As4()
			buf = append(buf, b[:]...)
		} else {
			b := a.As16()
			buf = append(buf, b[:]...)
		}
		buf = append(buf, flag)
		keys = append(keys, buf[start:len(buf):len(buf)])
	}
	for _, iv := range ivs {
		add(iv.first, rangeStart)
		if end := iv.last.Next(); end.IsValid() {
			add(end, rangeEnd)
		}
	}
	return keys
}

// lastAddr returns the last address of p (masked).
func lastAddr(p netip.Prefix) netip.Addr {
	if p.Addr().Is4() {
		b := p.Addr().As4()
		v := binary.BigEndian.Uint32(b[:]) | uint32(1<<(32-p.Bits())-1)
		return netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(b[:0], v)))
	}
	b := p.Addr().As16()
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	if host := 128 - p.Bits(); host >= 64 {
		hi |= 1<<(host-64) - 1
		lo = ^uint64(0)
	} else {
		lo |= 1<<host - 1
	}
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], lo)
	return netip.AddrFrom16(b)
}

// setElement turns an element key of s (as elements makes it) into a
// netlink set element.
func (s nftSetSpec) setElement(k []byte) nftables.SetElement {
	if !s.interval {
		return nftables.SetElement{Key: k}
	}
	n := len(k) - 1
	return nftables.SetElement{Key: k[:n:n], IntervalEnd: k[n] == rangeEnd}
}

// addrKeys returns addresses as set keys of size bytes (4 or 16). The
// keys share one backing array: sets hold thousands.
func addrKeys(addrs []netip.Addr, size int) [][]byte {
	buf := make([]byte, 0, size*len(addrs))
	keys := make([][]byte, len(addrs))
	for i, a := range addrs {
		if size == 4 {
			b := a.As4()
			buf = append(buf, b[:]...)
		} else {
			b := a.As16()
			buf = append(buf, b[:]...)
		}
		keys[i] = buf[size*i : size*(i+1) : size*(i+1)]
	}
	return keys
}

// portKeys returns ports as set keys (big-endian, 2 bytes).
func portKeys(ports []uint16) [][]byte {
	buf := make([]byte, 0, 2*len(ports))
	keys := make([][]byte, len(ports))
	for i, p := range ports {
		buf = binary.BigEndian.AppendUint16(buf, p)
		keys[i] = buf[2*i : 2*i+2 : 2*i+2]
	}
	return keys
}

// elementText prints one element as nft does.
func (s nftSetSpec) elementText(key []byte) string {
	if s.name == setPorts.name {
		return fmt.Sprint(binary.BigEndian.Uint16(key))
	}
	a, _ := netip.AddrFromSlice(key)
	return a.String()
}

// perLine is how many elements nft 1.0.6 prints on one line of a named
// set (calculate_delim in its src/expression.c).
func (s nftSetSpec) perLine() int {
	switch s.keyType.Name {
	case nftables.TypeIPAddr.Name:
		return 2
	case nftables.TypeInetService.Name:
		return 16
	}
	return 1
}

// nftChainSpec is one base chain.
type nftChainSpec struct {
	name     string
	hook     *nftables.ChainHook
	hookName string
	priority nftables.ChainPriority
	prioText string // how nft prints the priority
}

var nftChains = []nftChainSpec{
	// dstnat (-100) is nft's name for the NAT priority at prerouting; at
	// output nft prints the number.
	{"prerouting", nftables.ChainHookPrerouting, "prerouting", -100, "dstnat"},
	{"output", nftables.ChainHookOutput, "output", -100, "-100"},
}

func (c nftChainSpec) chain() *nftables.Chain {
	prio := c.priority
	policy := nftables.ChainPolicyAccept
	return &nftables.Chain{
		Name:     c.name,
		Table:    nftTable,
		Hooknum:  c.hook,
		Priority: &prio,
		Type:     nftables.ChainTypeNAT,
		Policy:   &policy,
	}
}

// nftRuleSpec is a rule each chain has: per address family, TCP to an
// address in the family's edge set and a port in the ports set, and TCP
// to any port of an address in the family's pod ranges, is redirected to
// the listener. In prerouting, redirect rewrites the destination to the
// address of the interface the packet came in on; in output, to 127.0.0.1
// or ::1. Unlike dnat to 127.0.0.1, this needs no
// net.ipv4.conf.all.route_localnet (see README.md).
type nftRuleSpec struct {
	nfproto    byte   // unix.NFPROTO_IPV4 or NFPROTO_IPV6
	l3         string // "ip" or "ip6"
	set        nftSetSpec
	addrOffset uint32 // of the destination address in the network header
	addrLen    uint32
	anyPort    bool // every TCP port, not those of the ports set
	comment    string
}

var nftRuleSpecs = []nftRuleSpec{
	{unix.NFPROTO_IPV4, "ip", setEdges4, 16, 4, false, marker + " IPv4 edge traffic to the listener"},
	{unix.NFPROTO_IPV6, "ip6", setEdges6, 24, 16, false, marker + " IPv6 edge traffic to the listener"},
	{unix.NFPROTO_IPV4, "ip", setPods4, 16, 4, true, marker + " IPv4 edge pod traffic to the listener"},
	{unix.NFPROTO_IPV6, "ip6", setPods6, 24, 16, true, marker + " IPv6 edge pod traffic to the listener"},
}

// exprs is the rule as netlink expressions; they are the ones nft itself
// generates for the rule's text, so that nft lists it as that text.
func (r nftRuleSpec) exprs(proxyPort uint16) []expr.Any {
	e := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{r.nfproto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: r.addrOffset, Len: r.addrLen},
		&expr.Lookup{SourceRegister: 1, SetName: r.set.name, SetID: r.set.id},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
	}
	if !r.anyPort {
		e = append(e,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: setPorts.name, SetID: setPorts.id})
	}
	return append(e,
		&expr.Immediate{Register: 1, Data: binary.BigEndian.AppendUint16(nil, proxyPort)},
		&expr.Redir{RegisterProtoMin: 1, RegisterProtoMax: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED})
}

func (r nftRuleSpec) userData() []byte {
	return userdata.AppendString(nil, userdata.TypeComment, r.comment)
}

func (r nftRuleSpec) text(proxyPort uint16) string {
	if r.anyPort {
		return fmt.Sprintf("%s daddr @%s meta l4proto tcp redirect to :%d comment %q",
			r.l3, r.set.name, proxyPort, r.comment)
	}
	return fmt.Sprintf("%s daddr @%s tcp dport @%s redirect to :%d comment %q",
		r.l3, r.set.name, setPorts.name, proxyPort, r.comment)
}

// renderNFT returns the table as `nft list table inet tether` prints it.
func renderNFT(st *state) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", nftTableName)
	first := true
	sep := func() {
		if !first {
			b.WriteString("\n")
		}
		first = false
	}
	for _, s := range nftSets {
		sep()
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n", s.name, s.keyType.Name)
		if s.interval {
			b.WriteString("\t\tflags interval\n")
		}
		fmt.Fprintf(&b, "\t\tcomment %q\n", s.comment)
		if elems := s.texts(st); len(elems) > 0 {
			b.WriteString("\t\telements = { ")
			for i, e := range elems {
				if i > 0 {
					if i%s.perLine() == 0 {
						b.WriteString(",\n\t\t\t     ")
					} else {
						b.WriteString(", ")
					}
				}
				b.WriteString(e)
			}
			b.WriteString(" }\n")
		}
		b.WriteString("\t}\n")
	}
	for _, c := range nftChains {
		sep()
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype nat hook %s priority %s; policy accept;\n", c.name, c.hookName, c.prioText)
		for _, r := range nftRuleSpecs {
			fmt.Fprintf(&b, "\t\t%s\n", r.text(st.proxyPort))
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}
