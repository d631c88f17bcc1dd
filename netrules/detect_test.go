package netrules

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func TestDetectDecision(t *testing.T) {
	noNFT := errors.New("no nf_tables")
	rules := map[string]int{"nft": 3, "legacy": 7}
	count := func(mode string) int { return rules[mode] }
	for _, tc := range []struct {
		name    string
		h       hostRules
		backend string
		mode    string
	}{
		{"empty host", hostRules{haveIPTables: true}, KindNFTables, ""},
		{"kube-proxy nftables", hostRules{nativeTables: []string{"ip kube-proxy"}, compatTables: []string{"ip nat"}, haveIPTables: true}, KindNFTables, ""},
		{"iptables-nft", hostRules{compatTables: []string{"ip nat", "ip filter"}, haveIPTables: true}, KindIPTables, "nft"},
		{"iptables-legacy", hostRules{legacyTables: []string{"nat"}, haveIPTables: true}, KindIPTables, "legacy"},
		{"both, legacy has more rules", hostRules{legacyTables: []string{"nat"}, compatTables: []string{"ip nat"}, haveIPTables: true}, KindIPTables, "legacy"},
		{"iptables rules, no iptables command", hostRules{compatTables: []string{"ip nat"}}, KindNFTables, ""},
		{"no nf_tables", hostRules{nftErr: noNFT, haveIPTables: true}, KindIPTables, ""},
	} {
		tc.h.countRules = count
		d, err := detect(tc.h)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if d.Backend != tc.backend || (tc.mode != "" && d.IPTablesMode != tc.mode) {
			t.Errorf("%s: got %+v, want %s %s", tc.name, d, tc.backend, tc.mode)
		}
		if d.Reason == "" {
			t.Errorf("%s: no reason given", tc.name)
		}
	}
	if _, err := detect(hostRules{nftErr: noNFT}); !errors.Is(err, noNFT) {
		t.Errorf("no backend at all: got %v", err)
	}
}

// TestKernelDetect checks Detect on namespaces set up as hosts are.
func TestKernelDetect(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tc := range []struct {
		name    string
		setup   [][]string
		backend string
		mode    string
	}{
		{"fresh", nil, KindNFTables, ""},
		{"kube-proxy nftables", [][]string{{"nft", "add", "table", "ip", "kube-proxy"}}, KindNFTables, ""},
		{"tether only", [][]string{{"nft", "add", "table", "inet", "tether"}}, KindNFTables, ""},
		{"iptables-nft", [][]string{{"iptables-nft", "-t", "nat", "-N", "KUBE-SERVICES"}}, KindIPTables, "nft"},
		{"iptables-legacy", [][]string{{"iptables-legacy", "-t", "nat", "-N", "KUBE-SERVICES"}}, KindIPTables, "legacy"},
		{"legacy with more rules", [][]string{
			{"iptables-nft", "-t", "nat", "-N", "DOCKER"},
			{"iptables-legacy", "-t", "nat", "-A", "PREROUTING", "-j", "RETURN"},
			{"iptables-legacy", "-t", "nat", "-A", "OUTPUT", "-j", "RETURN"},
		}, KindIPTables, "legacy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := testenv.NewHost(t, "nr-detect")
			for _, cmd := range tc.setup {
				h.Run(t, cmd[0], cmd[1:]...)
			}
			var d Detection
			if err := h.Do(func() (err error) { d, err = Detect(); return err }); err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", d)
			if d.Backend != tc.backend || d.IPTablesMode != tc.mode {
				t.Errorf("got %s %q, want %s %q", d.Backend, d.IPTablesMode, tc.backend, tc.mode)
			}
			var r Rules
			if err := h.Do(func() (err error) { r, err = New(KindAuto, Options{}); return err }); err != nil {
				t.Fatal(err)
			}
			if r.Backend() != tc.backend {
				t.Errorf("New(auto) made %s, want %s", r.Backend(), tc.backend)
			}
		})
	}
}

// TestKernelPermission checks that a process without CAP_NET_ADMIN gets
// ErrPermission, from both backends.
func TestKernelPermission(t *testing.T) {
	testenv.RequireRoot(t)
	h := testenv.NewHost(t, "nr-perm")
	for _, kind := range []string{KindNFTables, KindIPTables} {
		err := withoutNetAdmin(h, func() error {
			r, err := New(kind, Options{})
			if err != nil {
				return err
			}
			return r.Apply(context.Background(), goldenDesired)
		})
		t.Logf("%s: %v", kind, err)
		if !errors.Is(err, ErrPermission) {
			t.Errorf("%s without CAP_NET_ADMIN: got %v, want ErrPermission", kind, err)
		}
	}
	if out := h.Run(t, "nft", "list", "ruleset"); strings.TrimSpace(out) != "" {
		t.Errorf("ruleset changed:\n%s", out)
	}
}

// withoutNetAdmin runs fn on an OS thread of its own, in h's namespace,
// without CAP_NET_ADMIN in its capability sets or its bounding set (so
// the commands fn runs lack it too). Capabilities belong to threads: the
// goroutine ends locked to the thread, so the runtime discards it.
func withoutNetAdmin(h *testenv.Host, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked
		done <- func() error {
			ns, err := netns.GetFromName(h.Name)
			if err != nil {
				return err
			}
			defer ns.Close()
			if err := netns.Set(ns); err != nil {
				return err
			}
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_NET_ADMIN, 0, 0, 0); err != nil {
				return fmt.Errorf("drop from bounding set: %w", err)
			}
			hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			var data [2]unix.CapUserData
			if err := unix.Capget(&hdr, &data[0]); err != nil {
				return err
			}
			bit := uint32(1) << unix.CAP_NET_ADMIN
			data[0].Effective &^= bit
			data[0].Permitted &^= bit
			data[0].Inheritable &^= bit
			if err := unix.Capset(&hdr, &data[0]); err != nil {
				return fmt.Errorf("capset: %w", err)
			}
			return fn()
		}()
	}()
	return <-done
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{syscall.EPERM, ErrPermission},
		{fmt.Errorf("netlink receive: %w", syscall.EACCES), ErrPermission},
		{syscall.EOPNOTSUPP, ErrUnsupported},
		{syscall.EAFNOSUPPORT, ErrUnsupported},
	} {
		if got := classify("x", tc.err); !errors.Is(got, tc.want) {
			t.Errorf("classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if got := classify("x", syscall.EBUSY); errors.Is(got, ErrPermission) || errors.Is(got, ErrUnsupported) || !errors.Is(got, syscall.EBUSY) {
		t.Errorf("classify(EBUSY) = %v", got)
	}
	for out, want := range map[string]error{
		"iptables v1.8.9 (nf_tables): Could not fetch rule set generation id: Permission denied (you must be root)":      ErrPermission,
		"iptables v1.8.9 (legacy): can't initialize iptables table `nat': Table does not exist (do you need to insmod?)": ErrUnsupported,
	} {
		if got := iptError("x", errors.New("exit status 4"), out); !errors.Is(got, want) {
			t.Errorf("iptError(%q) = %v, want %v", out, got, want)
		}
	}
}
