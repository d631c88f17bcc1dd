package netrules

// The edge's iptables backend, for hosts without nf_tables: chains
// TETHER-EDGE-SERVICES (pods' connections, jumped to first from nat
// PREROUTING) and TETHER-EDGE-OUTPUT (the node's own, first in nat
// OUTPUT), one rule per pod range and marked ClusterIP and port. Each
// family costs one iptables-save to compare and, when something differs
// or a jump is no longer the first rule of its chain, one
// iptables-restore --noflush.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
)

const (
	edgeIPTChainServices = "TETHER-EDGE-SERVICES"
	edgeIPTChainOutput   = "TETHER-EDGE-OUTPUT"
	// edgeIPTChainPrefix starts the edge's chains' names.
	edgeIPTChainPrefix = "TETHER-EDGE-"
)

// edgeIPTChains in the order iptables-save lists user chains (by name).
var edgeIPTChains = []string{edgeIPTChainOutput, edgeIPTChainServices}

// edgeIPTJumps are in the order iptables-save lists them.
var edgeIPTJumps = []iptJump{
	{"PREROUTING", edgeIPTChainServices, marker + " pods of this node to marked Services"},
	{"OUTPUT", edgeIPTChainOutput, marker + " this node to marked Services"},
}

// edgeIPTRules renders st's rules for one family (4 or 6) as
// iptables-save prints them, chain by chain in its order.
func edgeIPTRules(st *edgeState, family int) []iptRule {
	bits := 32
	if family == 6 {
		bits = 128
	}
	var out []iptRule
	for _, ap := range st.services(family) {
		out = append(out, iptRule{edgeIPTChainOutput, fmt.Sprintf("-d %s -p tcp -m tcp --dport %d -m comment --comment %s -j REDIRECT --to-ports %d",
			netip.PrefixFrom(ap.Addr(), bits), ap.Port(), quote(marker+" marked Service"), st.port)})
	}
	node := st.node(family)
	if !node.IsValid() {
		return out
	}
	to := netip.AddrPortFrom(node, st.port).String()
	for _, p := range st.pods(family) {
		for _, ap := range st.services(family) {
			out = append(out, iptRule{edgeIPTChainServices, fmt.Sprintf("-s %s -d %s -p tcp -m tcp --dport %d -m comment --comment %s -j DNAT --to-destination %s",
				p, netip.PrefixFrom(ap.Addr(), bits), ap.Port(), quote(marker+" pods to a marked Service"), to)})
		}
	}
	return out
}

// renderEdgeIPTSave returns the lines of `iptables-save -t nat` that
// mention the edge's chains once st is applied.
func renderEdgeIPTSave(st *edgeState, family int) string {
	var b strings.Builder
	for _, c := range edgeIPTChains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, j := range edgeIPTJumps {
		fmt.Fprintf(&b, "-A %s %s\n", j.from, j.rule())
	}
	for _, r := range edgeIPTRules(st, family) {
		fmt.Fprintf(&b, "-A %s %s\n", r.chain, r.spec)
	}
	return b.String()
}

// renderEdgeIPTRestore returns iptables-restore --noflush input that
// replaces the edge chains' contents with st's rules and puts each jump
// first in its chain, once: every copy of it there is deleted (jumps
// counts them) and one inserted at the top.
func renderEdgeIPTRestore(st *edgeState, family int, jumps map[iptJump]int) string {
	var b strings.Builder
	b.WriteString("*nat\n")
	for _, c := range edgeIPTChains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, r := range edgeIPTRules(st, family) {
		fmt.Fprintf(&b, "-A %s %s\n", r.chain, r.spec)
	}
	for _, j := range edgeIPTJumps {
		for range jumps[j] {
			fmt.Fprintf(&b, "-D %s %s\n", j.from, j.rule())
		}
		fmt.Fprintf(&b, "-I %s 1 %s\n", j.from, j.rule())
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// renderEdgeIPTCleanup removes the jumps (each copy jumps counts) and the
// edge's chains.
func renderEdgeIPTCleanup(jumps map[iptJump]int) string {
	var b strings.Builder
	b.WriteString("*nat\n")
	for _, c := range edgeIPTChains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, j := range edgeIPTJumps {
		for range jumps[j] {
			fmt.Fprintf(&b, "-D %s %s\n", j.from, j.rule())
		}
	}
	for _, c := range edgeIPTChains {
		fmt.Fprintf(&b, "-X %s\n", c)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// edgeSaveLines keeps the lines of iptables-save output that mention one
// of the edge's chains, in order.
func edgeSaveLines(save string) string {
	var b strings.Builder
	for line := range strings.Lines(save) {
		if strings.Contains(line, edgeIPTChainPrefix) {
			b.WriteString(strings.TrimRight(line, "\n") + "\n")
		}
	}
	return b.String()
}

// edgeJumps counts each edge jump in a save, and reports whether each is
// the first rule of its chain.
func edgeJumps(save string) (counts map[iptJump]int, first bool) {
	counts = map[iptJump]int{}
	first = true
	seen := map[string]bool{}
	for line := range strings.Lines(save) {
		line = strings.TrimRight(line, "\n")
		for _, j := range edgeIPTJumps {
			prefix := "-A " + j.from + " "
			if !strings.HasPrefix(line, prefix) {
				continue
			}
			isJump := line == prefix+j.rule()
			if isJump {
				counts[j]++
			}
			if !seen[j.from] {
				seen[j.from] = true
				first = first && isJump
			}
		}
	}
	return counts, first
}

type edgeIPT struct {
	log  *slog.Logger
	fams []*iptFamily
	mu   sync.Mutex
}

var _ EdgeRules = (*edgeIPT)(nil)

// newEdgeIPT finds the iptables commands of mode ("nft", "legacy", or ""
// for what the host uses). IPv6 may be unusable; Apply then fails only if
// it has IPv6 to redirect.
func newEdgeIPT(log *slog.Logger, mode string) (*edgeIPT, error) {
	if mode == "" {
		mode = detectIPTablesMode()
	}
	r := &edgeIPT{log: edgeLogger(log, KindIPTables).With("iptables_mode", mode)}
	for _, v := range []int{4, 6} {
		f := newIPTFamily(v, mode)
		if f.err != nil && v == 4 {
			return nil, f.err
		}
		r.fams = append(r.fams, f)
	}
	return r, nil
}

func (*edgeIPT) Backend() string { return KindIPTables }

func (r *edgeIPT) Apply(ctx context.Context, d EdgeDesired) error {
	want, err := normalizeEdge(d)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, f := range r.fams {
		if f.err != nil {
			if len(want.services(f.v)) == 0 {
				continue
			}
			errs = append(errs, fmt.Errorf("redirect IPv%d Services: %w", f.v, f.err))
			continue
		}
		if err := r.applyFamily(ctx, f, want); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *edgeIPT) applyFamily(ctx context.Context, f *iptFamily, want *edgeState) error {
	save, err := f.saveNAT(ctx)
	if err != nil {
		return err
	}
	ours := edgeSaveLines(save)
	if err := edgeConflict(ours); err != nil {
		return fmt.Errorf("iptables (IPv%d): %w", f.v, err)
	}
	jumps, first := edgeJumps(save)
	if first && ours == renderEdgeIPTSave(want, f.v) {
		return nil
	}
	input := renderEdgeIPTRestore(want, f.v, jumps)
	r.log.Debug("netrules: iptables-restore", "family", f.v, "input", input)
	return f.run(ctx, f.restore, input, "--noflush", "-w")
}

func (r *edgeIPT) Cleanup(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, f := range r.fams {
		if f.err != nil {
			continue
		}
		save, err := f.saveNAT(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ours := edgeSaveLines(save)
		if ours == "" {
			continue
		}
		if err := edgeConflict(ours); err != nil {
			errs = append(errs, fmt.Errorf("iptables (IPv%d): leave chains alone: %w", f.v, err))
			continue
		}
		jumps, _ := edgeJumps(save)
		if err := f.run(ctx, f.restore, renderEdgeIPTCleanup(jumps), "--noflush", "-w"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// edgeConflict returns ErrConflict if one of the edge's chains holds a
// rule Tether did not write.
func edgeConflict(ours string) error {
	for line := range strings.Lines(ours) {
		if strings.HasPrefix(line, "-A "+edgeIPTChainPrefix) && !strings.Contains(line, `"`+marker) {
			return fmt.Errorf("%w: %s", ErrConflict, strings.TrimSpace(line))
		}
	}
	return nil
}
