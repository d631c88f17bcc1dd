package netrules

// The iptables ruleset, as data: four chains of Tether's own in the nat
// table, jumped to from PREROUTING and OUTPUT. It renders as
// iptables-restore input (what the backend writes) and as the lines
// `iptables-save -t nat` prints for it (what the backend compares with the
// kernel, and what the golden tests check).

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

const (
	iptChainPrerouting = "TETHER-PREROUTING"
	iptChainOutput     = "TETHER-OUTPUT"
	iptChainEdges      = "TETHER-EDGES"
	iptChainPods       = "TETHER-PODS"
	// iptChainPrefix starts the name of every chain Tether makes.
	iptChainPrefix = "TETHER-"
	// multiportMax is how many ports one multiport match takes.
	multiportMax = 15
)

// iptChains are Tether's chains in the order iptables-save lists them
// (user chains sorted by name).
var iptChains = []string{iptChainEdges, iptChainOutput, iptChainPods, iptChainPrerouting}

// iptJump is a rule in a built-in chain that enters one of ours.
type iptJump struct {
	from, to, comment string
}

// iptJumps are in the order iptables-save lists them (built-in chains in
// hook order).
var iptJumps = []iptJump{
	{"PREROUTING", iptChainPrerouting, marker + " routed edge traffic"},
	{"OUTPUT", iptChainOutput, marker + " local edge traffic"},
}

func (j iptJump) rule() string {
	return fmt.Sprintf("-m comment --comment %s -j %s", quote(j.comment), j.to)
}

// iptRule is one rule of one of our chains, in iptables-save syntax after
// "-A <chain> ".
type iptRule struct {
	chain string
	spec  string
}

// iptRuleList renders st's rules for one family (4 or 6), chain by chain in
// iptables-save order: TETHER-PREROUTING and TETHER-OUTPUT send TCP to a
// proxied port on to TETHER-EDGES, which redirects it to the listener if
// its destination is an edge address, and (when the family has pod
// ranges) all TCP on to TETHER-PODS, which redirects it if its destination
// is in a pod range. Each address and each range costs one rule, shared
// by both hooks.
func iptRuleList(st *state, family int) []iptRule {
	var rules []iptRule
	bits := 32
	if family == 6 {
		bits = 128
	}
	pods := st.pods(family)
	for _, chain := range iptChains {
		switch chain {
		case iptChainEdges:
			for _, a := range st.addrs(family) {
				rules = append(rules, iptRule{chain, fmt.Sprintf(
					"-d %s -p tcp -m comment --comment %s -j REDIRECT --to-ports %d",
					netip.PrefixFrom(a, bits), quote(marker+" "+st.owner(a)), st.proxyPort)})
			}
		case iptChainPods:
			for _, p := range pods {
				rules = append(rules, iptRule{chain, fmt.Sprintf(
					"-d %s -p tcp -m comment --comment %s -j REDIRECT --to-ports %d",
					p, quote(marker+" "+st.podOwner(p.Addr())), st.proxyPort)})
			}
		case iptChainOutput, iptChainPrerouting:
			for group := range slices.Chunk(st.ports, multiportMax) {
				ports := make([]string, len(group))
				for i, p := range group {
					ports[i] = strconv.Itoa(int(p))
				}
				rules = append(rules, iptRule{chain, fmt.Sprintf(
					"-p tcp -m multiport --dports %s -m comment --comment %s -j %s",
					strings.Join(ports, ","), quote(marker+" proxied ports"), iptChainEdges)})
			}
			if len(pods) > 0 {
				rules = append(rules, iptRule{chain, fmt.Sprintf(
					"-p tcp -m comment --comment %s -j %s", quote(marker+" pod ranges"), iptChainPods)})
			}
		}
	}
	return rules
}

// renderIPTRestore returns iptables-restore --noflush input that replaces
// our chains' contents with st's rules, inserts the jumps in missing (the
// kernel lacks them) and deletes those in extra (the kernel has them
// twice). Declaring a chain flushes it, or makes it; nothing else in the
// nat table is touched.
func renderIPTRestore(st *state, family int, missing, extra []iptJump) string {
	var b strings.Builder
	b.WriteString("*nat\n")
	for _, c := range iptChains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, r := range iptRuleList(st, family) {
		fmt.Fprintf(&b, "-A %s %s\n", r.chain, r.spec)
	}
	for _, j := range missing {
		fmt.Fprintf(&b, "-I %s 1 %s\n", j.from, j.rule())
	}
	for _, j := range extra {
		fmt.Fprintf(&b, "-D %s %s\n", j.from, j.rule())
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// renderIPTSave returns the lines of `iptables-save -t nat` that mention
// Tether's chains, as they read once st is applied: the chain
// declarations, the jumps, then our chains' rules.
func renderIPTSave(st *state, family int) string {
	var b strings.Builder
	for _, c := range iptChains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, j := range iptJumps {
		fmt.Fprintf(&b, "-A %s %s\n", j.from, j.rule())
	}
	for _, r := range iptRuleList(st, family) {
		fmt.Fprintf(&b, "-A %s %s\n", r.chain, r.spec)
	}
	return b.String()
}

// renderIPTCleanup returns iptables-restore --noflush input that removes
// the given jump rules and our chains. Chains are declared (made, if
// missing) and flushed before they are deleted, so it works whatever is
// left of them.
func renderIPTCleanup(jumps []iptJump) string {
	var b strings.Builder
	b.WriteString("*nat\n")
	for _, c := range iptChains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, j := range jumps {
		fmt.Fprintf(&b, "-D %s %s\n", j.from, j.rule())
	}
	for _, c := range iptChains {
		fmt.Fprintf(&b, "-X %s\n", c)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// ourSaveLines keeps the lines of iptables-save output that mention one
// of Tether's chains, in order; the edge's (TETHER-EDGE-*, edge_ipt.go)
// are not the gateway's.
func ourSaveLines(save string) string {
	var b strings.Builder
	for line := range strings.Lines(save) {
		if strings.Contains(line, iptChainPrefix) && !strings.Contains(line, edgeIPTChainPrefix) {
			b.WriteString(strings.TrimRight(line, "\n") + "\n")
		}
	}
	return b.String()
}

// quote quotes a comment as iptables-save does when it holds a space.
func quote(s string) string {
	return strconv.Quote(s)
}
