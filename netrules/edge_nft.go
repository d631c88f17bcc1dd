package netrules

// The edge's nftables backend: table inet tether-edge, rewritten whole in
// one batch whenever it differs from what Apply wants. It is small (the
// node's pod ranges and the marked Services), so there is no delta write.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// edgeTableName is the edge's table, in family inet.
const edgeTableName = "tether-edge"

// edgePriority is the edge chains' priority: after kube-proxy's
// firewall-check (dstnat - 10), which LoadBalancer source ranges need on
// the original destination, and before its DNAT (dstnat): the kernel
// runs the nat chains of a hook in priority order and the first that
// binds a connection wins.
const edgePriority = -105

var edgeTable = &nftables.Table{Name: edgeTableName, Family: nftables.TableFamilyINet}

// edgeSet is one set of the edge table.
type edgeSet struct {
	id       uint32
	name     string
	family   int
	services bool // a concatenation address . port; else an interval set of ranges
	comment  string
}

var (
	edgePods4     = edgeSet{1, "podnets4", 4, false, marker + " IPv4 pod ranges of this node"}
	edgePods6     = edgeSet{2, "podnets6", 6, false, marker + " IPv6 pod ranges of this node"}
	edgeServices4 = edgeSet{3, "services4", 4, true, marker + " marked IPv4 ClusterIPs and ports"}
	edgeServices6 = edgeSet{4, "services6", 6, true, marker + " marked IPv6 ClusterIPs and ports"}
	edgeSets      = []edgeSet{edgePods4, edgePods6, edgeServices4, edgeServices6}
)

func (s edgeSet) keyType() nftables.SetDatatype {
	addr := nftables.TypeIPAddr
	if s.family == 6 {
		addr = nftables.TypeIP6Addr
	}
	if s.services {
		return nftables.MustConcatSetType(addr, nftables.TypeInetService)
	}
	return addr
}

func (s edgeSet) set() *nftables.Set {
	return &nftables.Set{Table: edgeTable, ID: s.id, Name: s.name, KeyType: s.keyType(),
		Interval: !s.services, Concatenation: s.services, Comment: s.comment}
}

// keys returns the set's elements for st as keys: for the pod ranges as
// rangeKeys spells them (with a flag byte), for the services the address
// then the port, padded to a register's 4 bytes.
func (s edgeSet) keys(st *edgeState) [][]byte {
	if !s.services {
		return rangeKeys(st.pods(s.family))
	}
	var out [][]byte
	for _, ap := range st.services(s.family) {
		k := ap.Addr().AsSlice()
		k = binary.BigEndian.AppendUint16(k, ap.Port())
		out = append(out, append(k, 0, 0))
	}
	return out
}

func (s edgeSet) element(k []byte) nftables.SetElement {
	if s.services {
		return nftables.SetElement{Key: k}
	}
	n := len(k) - 1
	return nftables.SetElement{Key: k[:n:n], IntervalEnd: k[n] == rangeEnd}
}

// texts returns the set's elements as nft lists them.
func (s edgeSet) texts(st *edgeState) []string {
	var out []string
	if !s.services {
		for _, iv := range mergeRanges(st.pods(s.family)) {
			out = append(out, iv.String())
		}
		return out
	}
	for _, ap := range st.services(s.family) {
		out = append(out, fmt.Sprintf("%s . %d", ap.Addr(), ap.Port()))
	}
	return out
}

// edgeRule is one rule of the edge table.
type edgeRule struct {
	chain   string // "prerouting" (dnat to the node) or "output" (redirect)
	family  int
	comment string
}

var edgeRules = []edgeRule{
	{"prerouting", 4, marker + " IPv4 pods of this node to marked Services"},
	{"prerouting", 6, marker + " IPv6 pods of this node to marked Services"},
	{"output", 4, marker + " this node to marked IPv4 Services"},
	{"output", 6, marker + " this node to marked IPv6 Services"},
}

// usable reports whether st has the rule: a prerouting rule needs a node
// address of its family.
func (r edgeRule) usable(st *edgeState) bool {
	return r.chain == "output" || st.node(r.family).IsValid()
}

func (r edgeRule) sets() (pods, services edgeSet) {
	if r.family == 4 {
		return edgePods4, edgeServices4
	}
	return edgePods6, edgeServices6
}

// exprs is the rule as the netlink expressions nft generates for its
// text (nft --debug=netlink), so that nft lists it as that text.
func (r edgeRule) exprs(st *edgeState) []expr.Any {
	pods, svcs := r.sets()
	nfproto, off, alen, portReg := byte(unix.NFPROTO_IPV4), uint32(12), uint32(4), uint32(9)
	if r.family == 6 {
		nfproto, off, alen, portReg = unix.NFPROTO_IPV6, 8, 16, 2
	}
	e := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{nfproto}},
	}
	if r.chain == "prerouting" {
		e = append(e,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen},
			&expr.Lookup{SourceRegister: 1, SetName: pods.name, SetID: pods.id})
	}
	e = append(e,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off + alen, Len: alen},
		&expr.Payload{DestRegister: portReg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: svcs.name, SetID: svcs.id})
	port := binary.BigEndian.AppendUint16(nil, st.port)
	if r.chain == "output" {
		return append(e,
			&expr.Immediate{Register: 1, Data: port},
			&expr.Redir{RegisterProtoMin: 1, RegisterProtoMax: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED})
	}
	return append(e,
		&expr.Immediate{Register: 1, Data: st.node(r.family).AsSlice()},
		&expr.Immediate{Register: 2, Data: port},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(nfproto), RegAddrMin: 1, RegAddrMax: 1,
			RegProtoMin: 2, RegProtoMax: 2, Specified: true})
}

func (r edgeRule) text(st *edgeState) string {
	pods, svcs := r.sets()
	l3 := map[int]string{4: "ip", 6: "ip6"}[r.family]
	if r.chain == "output" {
		return fmt.Sprintf("%s daddr . tcp dport @%s redirect to :%d comment %q", l3, svcs.name, st.port, r.comment)
	}
	to := fmt.Sprintf("%s:%d", st.node(r.family), st.port)
	if r.family == 6 {
		to = fmt.Sprintf("[%s]:%d", st.node(r.family), st.port)
	}
	return fmt.Sprintf("%s saddr @%s %s daddr . tcp dport @%s dnat %s to %s comment %q",
		l3, pods.name, l3, svcs.name, l3, to, r.comment)
}

// edgeChains are the base chains; nft prints the priority as dstnat - 5
// at prerouting and as the number at output.
var edgeChains = []struct {
	name     string
	hook     *nftables.ChainHook
	prioText string
}{
	{"prerouting", nftables.ChainHookPrerouting, "dstnat - 5"},
	{"output", nftables.ChainHookOutput, "-105"},
}

// renderEdgeNFT returns the table as `nft list table inet tether-edge`
// prints it.
func renderEdgeNFT(st *edgeState) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", edgeTableName)
	for _, s := range edgeSets {
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n", s.name, strings.ReplaceAll(s.keyType().Name, " . ", " . "))
		if !s.services {
			b.WriteString("\t\tflags interval\n")
		}
		fmt.Fprintf(&b, "\t\tcomment %q\n", s.comment)
		if elems := s.texts(st); len(elems) > 0 {
			per := 1
			if !s.services && s.family == 4 {
				per = 2
			}
			b.WriteString("\t\telements = { ")
			for i, e := range elems {
				if i > 0 {
					if i%per == 0 {
						b.WriteString(",\n\t\t\t     ")
					} else {
						b.WriteString(", ")
					}
				}
				b.WriteString(e)
			}
			b.WriteString(" }\n")
		}
		b.WriteString("\t}\n\n")
	}
	for i, c := range edgeChains {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype nat hook %s priority %s; policy accept;\n", c.name, c.name, c.prioText)
		for _, r := range edgeRules {
			if r.chain == c.name && r.usable(st) {
				fmt.Fprintf(&b, "\t\t%s\n", r.text(st))
			}
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

type edgeNFT struct {
	log  *slog.Logger
	mu   sync.Mutex
	last *edgeState // what the kernel was last made to hold; nil: unknown
}

var _ EdgeRules = (*edgeNFT)(nil)

func newEdgeNFT(log *slog.Logger) (*edgeNFT, error) {
	c, err := nftConn(0)
	if err != nil {
		return nil, err
	}
	defer c.CloseLasting()
	if err := nftProbe(c); err != nil {
		return nil, err
	}
	return &edgeNFT{log: edgeLogger(log, KindNFTables)}, nil
}

func (*edgeNFT) Backend() string { return KindNFTables }

func (r *edgeNFT) Apply(ctx context.Context, d EdgeDesired) error {
	want, err := normalizeEdge(d)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := nftConn(0)
	if err != nil {
		return err
	}
	defer closeInBackground(c)
	obs, err := observeEdge(c)
	if err != nil {
		r.last = nil
		return err
	}
	if obs.exists && !obs.owned {
		r.last = nil
		return fmt.Errorf("nftables: table inet %s: %w", edgeTableName, ErrConflict)
	}
	if want.equal(r.last) && obs.matches(want) {
		return nil
	}
	if r.last != nil && obs.exists {
		r.log.Debug("netrules: edge table differs from what was applied, or the state changed; rewriting it")
	}
	c.AddTable(edgeTable) // so that the delete cannot fail if it is gone
	c.DelTable(edgeTable)
	c.AddTable(edgeTable)
	for _, s := range edgeSets {
		set := s.set()
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("nftables: set %s: %w", s.name, err)
		}
		keys := s.keys(want)
		if len(keys) == 0 {
			continue
		}
		elems := make([]nftables.SetElement, len(keys))
		for i, k := range keys {
			elems[i] = s.element(k)
		}
		if err := c.SetAddElements(set, elems); err != nil {
			return fmt.Errorf("nftables: set %s: %w", s.name, err)
		}
	}
	for _, ch := range edgeChains {
		prio := nftables.ChainPriority(edgePriority)
		policy := nftables.ChainPolicyAccept
		chain := c.AddChain(&nftables.Chain{Name: ch.name, Table: edgeTable, Hooknum: ch.hook, Priority: &prio,
			Type: nftables.ChainTypeNAT, Policy: &policy})
		for _, rule := range edgeRules {
			if rule.chain == ch.name && rule.usable(want) {
				c.AddRule(&nftables.Rule{Table: edgeTable, Chain: chain, Exprs: rule.exprs(want),
					UserData: userdata.AppendString(nil, userdata.TypeComment, rule.comment)})
			}
		}
	}
	if err := c.Flush(); err != nil {
		r.last = nil
		return classify(fmt.Sprintf("nftables: write table inet %s", edgeTableName), err)
	}
	r.last = want
	r.log.Debug("netrules: edge rules applied", "pod_ranges", len(want.pods4)+len(want.pods6),
		"services", len(want.services4)+len(want.services6), "node_ipv4", want.node4, "node_ipv6", want.node6)
	return nil
}

func (r *edgeNFT) Cleanup(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := nftConn(0)
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	obs, err := observeEdge(c)
	if err != nil {
		return err
	}
	r.last = nil
	if !obs.exists {
		return nil
	}
	if !obs.owned {
		return fmt.Errorf("nftables: remove table inet %s: %w", edgeTableName, ErrConflict)
	}
	c.DelTable(edgeTable)
	return classify(fmt.Sprintf("nftables: remove table inet %s", edgeTableName), c.Flush())
}

// edgeObserved is what the kernel holds in table inet tether-edge.
type edgeObserved struct {
	exists, owned bool
	rules         map[string][]string // chain → rule comments
	elems         map[string][][]byte // set → element keys, sorted
}

func observeEdge(c *nftables.Conn) (*edgeObserved, error) {
	obs := &edgeObserved{rules: map[string][]string{}, elems: map[string][][]byte{}}
	tables, err := nftListTables(c)
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		obs.exists = obs.exists || t.Name == edgeTableName
	}
	if !obs.exists {
		return obs, nil
	}
	sets, err := c.GetSets(edgeTable)
	if err != nil {
		return nil, classify("nftables: list sets", err)
	}
	for _, s := range sets {
		if strings.HasPrefix(s.Comment, marker) {
			obs.owned = true
		}
		keys, err := setKeys(c, s)
		if err != nil {
			return nil, err
		}
		obs.elems[s.Name] = keys
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, classify("nftables: list chains", err)
	}
	for _, ch := range chains {
		if ch.Table.Name != edgeTableName {
			continue
		}
		rules, err := c.GetRules(edgeTable, ch)
		if err != nil {
			return nil, classify("nftables: list rules of chain "+ch.Name, err)
		}
		obs.rules[ch.Name] = []string{}
		for _, rl := range rules {
			cm, _ := userdata.GetString(rl.UserData, userdata.TypeComment)
			if strings.HasPrefix(cm, marker) {
				obs.owned = true
			}
			obs.rules[ch.Name] = append(obs.rules[ch.Name], cm)
		}
	}
	return obs, nil
}

// matches reports whether the table holds want's chains, rules (by their
// comments) and set elements. The rules' expressions are not compared:
// they change only with want's node addresses and port, which a changed
// want rewrites.
func (o *edgeObserved) matches(want *edgeState) bool {
	if !o.exists || len(o.rules) != len(edgeChains) {
		return false
	}
	for _, ch := range edgeChains {
		var comments []string
		for _, r := range edgeRules {
			if r.chain == ch.name && r.usable(want) {
				comments = append(comments, r.comment)
			}
		}
		if !slices.Equal(o.rules[ch.name], comments) {
			return false
		}
	}
	if len(o.elems) != len(edgeSets) {
		return false
	}
	for _, s := range edgeSets {
		have, ok := o.elems[s.name]
		if !ok {
			return false
		}
		have = slices.Clone(have)
		slices.SortFunc(have, bytes.Compare)
		want := s.keys(want)
		slices.SortFunc(want, bytes.Compare)
		if !slices.EqualFunc(have, want, bytes.Equal) {
			return false
		}
	}
	return true
}
