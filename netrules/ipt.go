package netrules

// The iptables backend: chains TETHER-* in the nat table, for iptables and
// ip6tables, legacy or nft-compat. Each family costs one iptables-save
// (to compare) and, when something differs, one iptables-restore --noflush
// (to write): never one exec per rule.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"sync"

	"github.com/coreos/go-iptables/iptables"
)

// iptFamily is iptables or ip6tables, in one mode.
type iptFamily struct {
	v       int // 4 or 6
	ipt     *iptables.IPTables
	save    string // iptables-save path
	restore string // iptables-restore path
	err     error  // why this family is unusable; nil if it works
}

type iptRules struct {
	mode string // "nft" or "legacy"
	fams []*iptFamily

	mu sync.Mutex
	tracker
}

var _ Rules = (*iptRules)(nil)

// newIPTRules finds the iptables commands of mode ("nft", "legacy", or ""
// for what the host uses) and checks that the nat table works. IPv6 may
// be unavailable (ip6tables missing, IPv6 disabled); Apply then fails only
// if it is given IPv6 addresses or pod ranges.
func newIPTRules(log *slog.Logger, mode string) (*iptRules, error) {
	if mode == "" {
		mode = detectIPTablesMode()
	}
	r := &iptRules{mode: mode, tracker: tracker{log: log.With("backend", KindIPTables, "iptables_mode", mode), needFull: true}}
	for _, v := range []int{4, 6} {
		f := newIPTFamily(v, mode)
		if f.err != nil && v == 4 {
			return nil, f.err
		}
		if f.err != nil {
			r.log.Warn("netrules: ip6tables unusable; IPv6 edge addresses and pod ranges cannot be redirected", "err", f.err)
		}
		r.fams = append(r.fams, f)
	}
	return r, nil
}

func newIPTFamily(v int, mode string) *iptFamily {
	base, proto := "iptables", iptables.ProtocolIPv4
	if v == 6 {
		base, proto = "ip6tables", iptables.ProtocolIPv6
	}
	f := &iptFamily{v: v}
	cmd := lookPath(base+"-"+mode, base)
	f.save = lookPath(base+"-"+mode+"-save", base+"-save")
	f.restore = lookPath(base+"-"+mode+"-restore", base+"-restore")
	for _, p := range []string{cmd, f.save, f.restore} {
		if !strings.HasPrefix(p, "/") {
			f.err = fmt.Errorf("%s: %w: command %s not found", base, ErrUnsupported, p)
			return f
		}
	}
	ipt, err := iptables.New(iptables.IPFamily(proto), iptables.Path(cmd))
	if err != nil {
		f.err = iptError(base, err, "")
		return f
	}
	if _, err := ipt.ChainExists("nat", "PREROUTING"); err != nil {
		f.err = iptError(base+": nat table", err, "")
		return f
	}
	f.ipt = ipt
	return f
}

// lookPath returns the path of the first command found, or the last name
// if none is.
func lookPath(names ...string) string {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return names[len(names)-1]
}

func (*iptRules) Backend() string { return KindIPTables }

func (r *iptRules) Apply(ctx context.Context, d Desired) error {
	want, err := normalize(d)
	if err != nil {
		return err
	}
	want.logShadowed(r.log)
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, f := range r.fams {
		if err := r.applyFamily(ctx, f, want); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		r.failed()
		return err
	}
	r.succeeded(want)
	return nil
}

// FlushConntrack deletes the conntrack entries of what the Applies since
// the last flush stopped redirecting.
func (r *iptRules) FlushConntrack(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.flushConntrack()
}

func (r *iptRules) applyFamily(ctx context.Context, f *iptFamily, want *state) error {
	if f.err != nil {
		if len(want.addrs(f.v)) == 0 && len(want.pods(f.v)) == 0 {
			return nil
		}
		return fmt.Errorf("redirect IPv%d edge addresses and pod ranges: %w", f.v, f.err)
	}
	ours, err := f.ours(ctx)
	if err != nil {
		return err
	}
	if r.needFull {
		if err := conflict(ours); err != nil {
			return fmt.Errorf("iptables (IPv%d): %w", f.v, err)
		}
	}
	wantText := renderIPTSave(want, f.v)
	if ours == wantText {
		return nil
	}
	if !r.needFull && r.last != nil && ours != renderIPTSave(r.last, f.v) {
		r.log.Warn("netrules: our chains were changed by someone else; rewriting them", "family", f.v)
	}
	missing, extra := jumpsToFix(ours)
	input := renderIPTRestore(want, f.v, missing, extra)
	r.log.Debug("netrules: iptables-restore", "family", f.v, "input", input)
	return f.run(ctx, f.restore, input, "--noflush", "-w")
}

func (r *iptRules) Cleanup(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, f := range r.fams {
		if f.err != nil {
			continue
		}
		ours, err := f.ours(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ours == "" {
			continue
		}
		if err := conflict(ours); err != nil {
			errs = append(errs, fmt.Errorf("iptables (IPv%d): leave chains alone: %w", f.v, err))
			continue
		}
		var jumps []iptJump
		for _, j := range iptJumps {
			for range strings.Count(ours, "-A "+j.from+" "+j.rule()+"\n") {
				jumps = append(jumps, j)
			}
		}
		if err := f.run(ctx, f.restore, renderIPTCleanup(jumps), "--noflush", "-w"); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		r.failed()
		return err
	}
	r.succeeded(nil)
	r.flushLogged()
	return nil
}

// ours returns the lines of iptables-save -t nat that mention our chains.
func (f *iptFamily) ours(ctx context.Context) (string, error) {
	save, err := f.saveNAT(ctx)
	if err != nil {
		return "", err
	}
	return ourSaveLines(save), nil
}

// saveNAT returns what iptables-save -t nat prints.
func (f *iptFamily) saveNAT(ctx context.Context) (string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, f.save, "-t", "nat")
	cmd.Stdout = &out
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", iptError(f.save+" -t nat", err, stderr.String())
	}
	return out.String(), nil
}

// run runs an iptables command with input on stdin.
func (f *iptFamily) run(ctx context.Context, path, input string, args ...string) error {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdin = strings.NewReader(input)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return iptError(fmt.Sprintf("%s %s", path, strings.Join(args, " ")), err, string(out))
	}
	return nil
}

// conflict returns ErrConflict if one of our chains holds a rule Tether
// did not write (every rule Tether writes carries its comment).
func conflict(ours string) error {
	for line := range strings.Lines(ours) {
		if strings.HasPrefix(line, "-A "+iptChainPrefix) && !strings.Contains(line, `"`+marker) {
			return fmt.Errorf("%w: %s", ErrConflict, strings.TrimSpace(line))
		}
	}
	return nil
}

// jumpsToFix compares the jump rules in ours with iptJumps: missing ones
// must be inserted, duplicates deleted.
func jumpsToFix(ours string) (missing, extra []iptJump) {
	for _, j := range iptJumps {
		n := strings.Count(ours, "-A "+j.from+" "+j.rule()+"\n")
		if n == 0 {
			missing = append(missing, j)
		}
		for ; n > 1; n-- {
			extra = append(extra, j)
		}
	}
	return missing, extra
}

// iptError wraps an error of an iptables command with what was being done
// and, where its message says so, ErrPermission or ErrUnsupported.
func iptError(doing string, err error, output string) error {
	msg := strings.TrimSpace(output)
	var ie *iptables.Error
	if errors.As(err, &ie) {
		msg = ie.Error()
	}
	low := strings.ToLower(msg)
	switch {
	case errors.Is(err, exec.ErrNotFound):
		return fmt.Errorf("%s: %w: %v", doing, ErrUnsupported, err)
	case strings.Contains(low, "permission denied"), strings.Contains(low, "you must be root"),
		strings.Contains(low, "operation not permitted"):
		return fmt.Errorf("%s: %w: %s", doing, ErrPermission, msg)
	case strings.Contains(low, "table does not exist"), strings.Contains(low, "can't initialize"),
		strings.Contains(low, "not supported"), strings.Contains(low, "protocol not available"):
		return fmt.Errorf("%s: %w: %s", doing, ErrUnsupported, msg)
	}
	if msg != "" {
		return fmt.Errorf("%s: %w: %s", doing, err, msg)
	}
	return fmt.Errorf("%s: %w", doing, err)
}
