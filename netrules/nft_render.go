package netrules

// The nftables ruleset, as data. The table and its chains and rules are
// static (only the listener's port appears in a rule); what changes is in
// three sets. Everything here renders two ways: as netlink objects for
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
	comment string
}

var (
	setEdges4 = nftSetSpec{1, "edges4", nftables.TypeIPAddr, marker + " IPv4 addresses of edge nodes"}
	setEdges6 = nftSetSpec{2, "edges6", nftables.TypeIP6Addr, marker + " IPv6 addresses of edge nodes"}
	setPorts  = nftSetSpec{3, "ports", nftables.TypeInetService, marker + " proxied TCP ports"}
	nftSets   = []nftSetSpec{setEdges4, setEdges6, setPorts}
)

func (s nftSetSpec) set() *nftables.Set {
	return &nftables.Set{Table: nftTable, ID: s.id, Name: s.name, KeyType: s.keyType, Comment: s.comment}
}

// elements returns the set's elements for state st, in nft's listing
// order (ascending).
func (s nftSetSpec) elements(st *state) [][]byte {
	switch s.name {
	case setEdges4.name:
		return addrKeys(st.v4, 4)
	case setEdges6.name:
		return addrKeys(st.v6, 16)
	}
	return portKeys(st.ports)
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

// nftRuleSpec is the rule each chain has per address family: TCP to an
// address in the family's edge set and a port in the ports set is
// redirected to the listener. In prerouting, redirect rewrites the
// destination to the address of the interface the packet came in on; in
// output, to 127.0.0.1 or ::1. Unlike dnat to 127.0.0.1, this needs no
// net.ipv4.conf.all.route_localnet (see README.md).
type nftRuleSpec struct {
	nfproto    byte   // unix.NFPROTO_IPV4 or NFPROTO_IPV6
	l3         string // "ip" or "ip6"
	set        nftSetSpec
	addrOffset uint32 // of the destination address in the network header
	addrLen    uint32
	comment    string
}

var nftRuleSpecs = []nftRuleSpec{
	{unix.NFPROTO_IPV4, "ip", setEdges4, 16, 4, marker + " IPv4 edge traffic to the listener"},
	{unix.NFPROTO_IPV6, "ip6", setEdges6, 24, 16, marker + " IPv6 edge traffic to the listener"},
}

// exprs is the rule as netlink expressions; they are the ones nft itself
// generates for the rule's text, so that nft lists it as that text.
func (r nftRuleSpec) exprs(proxyPort uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{r.nfproto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: r.addrOffset, Len: r.addrLen},
		&expr.Lookup{SourceRegister: 1, SetName: r.set.name, SetID: r.set.id},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: setPorts.name, SetID: setPorts.id},
		&expr.Immediate{Register: 1, Data: binary.BigEndian.AppendUint16(nil, proxyPort)},
		&expr.Redir{RegisterProtoMin: 1, RegisterProtoMax: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

func (r nftRuleSpec) userData() []byte {
	return userdata.AppendString(nil, userdata.TypeComment, r.comment)
}

func (r nftRuleSpec) text(proxyPort uint16) string {
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
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n\t\tcomment %q\n", s.name, s.keyType.Name, s.comment)
		if elems := s.elements(st); len(elems) > 0 {
			b.WriteString("\t\telements = { ")
			for i, e := range elems {
				if i > 0 {
					if i%s.perLine() == 0 {
						b.WriteString(",\n\t\t\t     ")
					} else {
						b.WriteString(", ")
					}
				}
				b.WriteString(s.elementText(e))
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
