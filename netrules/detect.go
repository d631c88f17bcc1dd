package netrules

// Backend detection for --netrules=auto.
//
// Tether's rules work next to anyone else's on either backend; auto picks
// the one the host already uses so that operators find Tether's rules where
// they look for the others (nft list ruleset, or iptables-save). The
// heuristic follows kube-proxy's iptables-wrapper (which picks legacy or nft
// iptables by where the rules are) one level up:
//
//  1. nftables tables that iptables-nft did not make (kube-proxy's nftables
//     mode "ip kube-proxy", firewalld's "inet firewalld", Debian's
//     "inet filter" from /etc/nftables.conf...): nftables.
//  2. Else, iptables rules, legacy (the kernel lists x_tables tables in
//     /proc/net/ip{,6}_tables_names once legacy iptables used them) or nft-compat (tables of iptables'
//     names, such as "ip nat", in families ip/ip6): iptables, in the mode
//     that holds them; if both do, the one with more rules, as
//     iptables-wrapper decides.
//  3. Else (a host with no rules at all): nftables if the kernel has
//     nf_tables, iptables otherwise.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/google/nftables"
)

// Detection is what Detect decided, and why.
type Detection struct {
	// Backend is KindNFTables or KindIPTables.
	Backend string
	// IPTablesMode is "nft" or "legacy" when Backend is KindIPTables.
	IPTablesMode string
	// Reason says what on the host made the choice, for the log.
	Reason string
}

// hostRules is what detection looks at.
type hostRules struct {
	nftErr       error    // nil if nf_tables answered
	nativeTables []string // "family name" of nftables tables not made by iptables-nft (nor Tether)
	compatTables []string // "family name" of tables iptables-nft made
	legacyTables []string // x_tables tables in use (legacy iptables)
	haveIPTables bool     // an iptables command is installed
	// countRules counts the rules of iptables mode "nft" or "legacy";
	// called only when both modes have tables.
	countRules func(mode string) int
}

// Detect looks at the rules of the calling thread's network namespace and
// picks a backend, as described in the comment at the top of detect.go.
func Detect() (Detection, error) {
	return detect(observeHost())
}

// iptablesTableNames are the tables iptables-nft creates in families ip
// and ip6 (and arptables/ebtables in theirs).
var iptablesTableNames = []string{"filter", "nat", "mangle", "raw", "security", "broute"}

func observeHost() hostRules {
	h := hostRules{countRules: countIPTablesRules}
	c, _ := nftables.New()
	tables, err := c.ListTables()
	if err != nil {
		h.nftErr = nftProbe(c)
		if h.nftErr == nil {
			h.nftErr = err
		}
	}
	for _, t := range tables {
		name := familyName(t.Family) + " " + t.Name
		switch {
		case t.Family == nftables.TableFamilyINet && t.Name == nftTableName:
			// Tether's own, from an earlier run.
		case t.Family != nftables.TableFamilyINet && t.Family != nftables.TableFamilyNetdev &&
			slices.Contains(iptablesTableNames, t.Name):
			h.compatTables = append(h.compatTables, name)
		default:
			h.nativeTables = append(h.nativeTables, name)
		}
	}
	// thread-self: /proc/net is the namespace of the process's main thread,
	// not necessarily the caller's.
	for _, f := range []string{"/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names"} {
		if b, err := os.ReadFile(f); err == nil {
			h.legacyTables = append(h.legacyTables, strings.Fields(string(b))...)
		}
	}
	_, err = exec.LookPath("iptables")
	h.haveIPTables = err == nil
	return h
}

func detect(h hostRules) (Detection, error) {
	switch {
	case h.nftErr == nil && len(h.nativeTables) > 0:
		return Detection{Backend: KindNFTables, Reason: "host has nftables tables: " + strings.Join(h.nativeTables, ", ")}, nil
	case h.haveIPTables && (len(h.legacyTables) > 0 || len(h.compatTables) > 0):
		mode := "nft"
		switch {
		case len(h.compatTables) == 0:
			mode = "legacy"
		case len(h.legacyTables) > 0 && h.countRules("legacy") > h.countRules("nft"):
			mode = "legacy"
		}
		return Detection{Backend: KindIPTables, IPTablesMode: mode, Reason: fmt.Sprintf(
			"host has iptables rules (legacy tables: %v; nft-compat tables: %v)", h.legacyTables, h.compatTables)}, nil
	case h.nftErr == nil:
		return Detection{Backend: KindNFTables, Reason: "host has no rules yet; the kernel has nf_tables"}, nil
	case h.haveIPTables:
		return Detection{Backend: KindIPTables, IPTablesMode: detectIPTablesMode(),
			Reason: fmt.Sprintf("host has no rules yet; nftables unusable (%v)", h.nftErr)}, nil
	}
	return Detection{}, fmt.Errorf("netrules: no backend: nftables: %w; iptables: command not found", h.nftErr)
}

// detectIPTablesMode returns the mode of the iptables command installed
// ("nft" or "legacy") when nothing else decides.
func detectIPTablesMode() string {
	out, err := exec.Command("iptables", "--version").Output()
	if err == nil && bytes.Contains(out, []byte("legacy")) {
		return "legacy"
	}
	if errors.Is(err, exec.ErrNotFound) {
		if _, err := exec.LookPath("iptables-legacy"); err == nil {
			if _, err := exec.LookPath("iptables-nft"); err != nil {
				return "legacy"
			}
		}
	}
	return "nft"
}

// countIPTablesRules counts the rules iptables-<mode>-save and
// ip6tables-<mode>-save print, as iptables-wrapper does.
func countIPTablesRules(mode string) int {
	n := 0
	for _, cmd := range []string{"iptables-" + mode + "-save", "ip6tables-" + mode + "-save"} {
		out, err := exec.Command(cmd).Output()
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(out)) {
			if strings.HasPrefix(line, "-") {
				n++
			}
		}
	}
	return n
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyNetdev:
		return "netdev"
	case nftables.TableFamilyBridge:
		return "bridge"
	}
	return fmt.Sprintf("family%d", f)
}
