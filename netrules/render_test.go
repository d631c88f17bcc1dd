package netrules

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/netrules")

// goldenDesired is the fixed state of the golden files: IPv4 and IPv6,
// a node with several addresses, an IPv4-mapped address, an address two
// nodes claim, unsorted and repeated ports.
var goldenDesired = Desired{
	Edges: map[string][]netip.Addr{
		"edge-a": {netip.MustParseAddr("10.20.0.5"), netip.MustParseAddr("fd00:20::5")},
		"edge-b": {netip.MustParseAddr("10.20.0.6")},
		"edge-c": {netip.MustParseAddr("192.168.7.10"), netip.MustParseAddr("10.20.0.17")},
		"edge-d": {netip.MustParseAddr("fd00:20::1:9")},
		"edge-e": {netip.MustParseAddr("::ffff:10.20.1.1")},
		"edge-f": {netip.MustParseAddr("10.20.0.6")},
	},
	Ports:     []uint16{10255, 10250, 10250, 8080},
	ProxyPort: 10263,
}

// goldenPath returns the path of a golden file in testdata/netrules.
func goldenPath(name string) string {
	return filepath.Join("..", "testdata", "netrules", name)
}

// checkGolden compares got with the golden file, or rewrites it with
// -update.
func checkGolden(t testing.TB, name, got string) {
	t.Helper()
	path := goldenPath(name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run with -update to create it): %v", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s mismatch (-golden +got):\n%s", name, diff)
	}
}

func mustNormalize(t testing.TB, d Desired) *state {
	t.Helper()
	st, err := normalize(d)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestGoldenNFT(t *testing.T) {
	checkGolden(t, "nftables.golden", renderNFT(mustNormalize(t, goldenDesired)))
}

func TestGoldenIPTables(t *testing.T) {
	st := mustNormalize(t, goldenDesired)
	checkGolden(t, "iptables.golden", renderIPTSave(st, 4))
	checkGolden(t, "ip6tables.golden", renderIPTSave(st, 6))
}

func TestRenderEmpty(t *testing.T) {
	st := mustNormalize(t, Desired{ProxyPort: 10263})
	got := renderNFT(st)
	if strings.Contains(got, "elements") {
		t.Errorf("empty sets list elements:\n%s", got)
	}
	want := strings.Join([]string{
		":TETHER-EDGES - [0:0]",
		":TETHER-OUTPUT - [0:0]",
		":TETHER-PREROUTING - [0:0]",
		`-A PREROUTING -m comment --comment "tether: routed edge traffic" -j TETHER-PREROUTING`,
		`-A OUTPUT -m comment --comment "tether: local edge traffic" -j TETHER-OUTPUT`,
		"",
	}, "\n")
	if diff := cmp.Diff(want, renderIPTSave(st, 4)); diff != "" {
		t.Errorf("iptables, no edges and no ports (-want +got):\n%s", diff)
	}
}

func TestRenderManyPorts(t *testing.T) {
	d := Desired{ProxyPort: 10263, Edges: map[string][]netip.Addr{"n": {netip.MustParseAddr("10.0.0.1")}}}
	for p := range uint16(20) {
		d.Ports = append(d.Ports, 1000+p)
	}
	st := mustNormalize(t, d)
	var dispatch int
	for _, r := range iptRuleList(st, 4) {
		if r.chain == iptChainPrerouting {
			dispatch++
			if n := strings.Count(r.spec, ",") + 1; n > multiportMax {
				t.Errorf("multiport match with %d ports: %s", n, r.spec)
			}
		}
	}
	if dispatch != 2 {
		t.Errorf("20 ports in %d multiport rules, want 2", dispatch)
	}
	// nft prints 16 ports a line.
	if got := renderNFT(st); !strings.Contains(got, "1015,\n\t\t\t     1016") {
		t.Errorf("ports not wrapped after 16:\n%s", got)
	}
}

func TestNormalize(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    Desired
	}{
		{"no proxy port", Desired{Ports: []uint16{1}}},
		{"port 0", Desired{ProxyPort: 1, Ports: []uint16{0}}},
		{"invalid address", Desired{ProxyPort: 1, Edges: map[string][]netip.Addr{"n": {{}}}}},
		{"unspecified address", Desired{ProxyPort: 1, Edges: map[string][]netip.Addr{"n": {netip.IPv4Unspecified()}}}},
		{"zone", Desired{ProxyPort: 1, Edges: map[string][]netip.Addr{"n": {netip.MustParseAddr("fe80::1%eth0")}}}},
	} {
		if _, err := normalize(tc.d); err == nil {
			t.Errorf("%s: normalize succeeded", tc.name)
		}
	}
	st := mustNormalize(t, goldenDesired)
	if got, want := st.owner(netip.MustParseAddr("10.20.0.6")), "edge-b"; got != want {
		t.Errorf("address claimed by edge-b and edge-f is owned by %q, want %q", got, want)
	}
	if got := st.owner(netip.MustParseAddr("fd00:20::1:9")); got != "edge-d" {
		t.Errorf("owner of fd00:20::1:9 = %q, want edge-d", got)
	}
	if got := st.owner(netip.MustParseAddr("10.99.99.99")); got != "" {
		t.Errorf("owner of an address nobody claims = %q", got)
	}
	if !st.redirects(netip.MustParseAddr("10.20.1.1"), 8080) || st.redirects(netip.MustParseAddr("10.20.1.1"), 8081) {
		t.Error("redirects: wrong answer for 10.20.1.1")
	}
}

func TestDiffSorted(t *testing.T) {
	added, removed := diffSorted([]int{1, 3, 4, 9}, []int{2, 3, 5, 9, 10}, func(a, b int) int { return a - b })
	if diff := cmp.Diff([]int{2, 5, 10}, added); diff != "" {
		t.Errorf("added (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{1, 4}, removed); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
}

func TestDiffKeys(t *testing.T) {
	k := func(s ...string) [][]byte {
		var out [][]byte
		for _, x := range s {
			out = append(out, []byte(x))
		}
		return out
	}
	added, removed := diffKeys(k("a", "c", "d"), k("b", "c", "e"))
	if diff := cmp.Diff(k("b", "e"), added); diff != "" {
		t.Errorf("added (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(k("a", "d"), removed); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
}
