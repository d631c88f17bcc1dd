package netrules

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/netrules")

// goldenDesired is the fixed state of the golden files: IPv4 and IPv6,
// a node with several addresses, an IPv4-mapped address, an address two
// nodes claim, unsorted and repeated ports; pod ranges of both families,
// one that two nodes claim, one inside another, adjacent ones (one
// interval in nftables), one with host bits set, an IPv4-mapped one of a
// single address.
var goldenDesired = Desired{
	Edges: map[string][]netip.Addr{
		"edge-a": {netip.MustParseAddr("10.20.0.5"), netip.MustParseAddr("fd00:20::5")},
		"edge-b": {netip.MustParseAddr("10.20.0.6")},
		"edge-c": {netip.MustParseAddr("192.168.7.10"), netip.MustParseAddr("10.20.0.17")},
		"edge-d": {netip.MustParseAddr("fd00:20::1:9")},
		"edge-e": {netip.MustParseAddr("::ffff:10.20.1.1")},
		"edge-f": {netip.MustParseAddr("10.20.0.6")},
	},
	Ports: []uint16{10255, 10250, 10250, 8080},
	PodRanges: map[string][]netip.Prefix{
		"edge-a": {netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244:0:1::/64")},
		"edge-b": {netip.MustParsePrefix("10.244.2.0/24")},
		"edge-c": {netip.MustParsePrefix("10.244.1.0/24")},
		"edge-d": {netip.MustParsePrefix("10.244.2.64/26")},
		"edge-e": {netip.MustParsePrefix("::ffff:10.244.9.7/128")},
		"edge-f": {netip.MustParsePrefix("10.244.5.9/24"), netip.MustParsePrefix("fd00:244:0:3::5/64")},
	},
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
		":TETHER-PODS - [0:0]",
		":TETHER-PREROUTING - [0:0]",
		`-A PREROUTING -m comment --comment "tether: routed edge traffic" -j TETHER-PREROUTING`,
		`-A OUTPUT -m comment --comment "tether: local edge traffic" -j TETHER-OUTPUT`,
		"",
	}, "\n")
	if diff := cmp.Diff(want, renderIPTSave(st, 4)); diff != "" {
		t.Errorf("iptables, no edges, no ports, no pod ranges (-want +got):\n%s", diff)
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

func TestNormalizePodRanges(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    netip.Prefix
	}{
		{"invalid", netip.Prefix{}},
		{"bits out of range", netip.PrefixFrom(netip.MustParseAddr("10.0.0.0"), 33)},
		{"all IPv4", netip.MustParsePrefix("0.0.0.0/0")},
		{"all IPv6", netip.MustParsePrefix("::/0")},
		{"all IPv4, mapped", netip.MustParsePrefix("::ffff:0.0.0.0/96")},
	} {
		d := Desired{ProxyPort: 1, PodRanges: map[string][]netip.Prefix{"n": {tc.p}}}
		if _, err := normalize(d); err == nil {
			t.Errorf("%s: normalize accepted pod range %v", tc.name, tc.p)
		}
	}

	// Map order must not matter: normalize many times.
	want := mustNormalize(t, goldenDesired)
	for range 20 {
		st := mustNormalize(t, goldenDesired)
		if !slices.Equal(st.pods4, want.pods4) || !slices.Equal(st.podOwners4, want.podOwners4) ||
			!slices.Equal(st.pods6, want.pods6) || !slices.Equal(st.podOwners6, want.podOwners6) ||
			!slices.Equal(st.shadowed, want.shadowed) {
			t.Fatalf("normalize is not deterministic:\n%+v\n%+v", st, want)
		}
	}
	pfx := netip.MustParsePrefix
	if diff := cmp.Diff([]string{"10.244.1.0/24", "10.244.2.0/24", "10.244.5.0/24", "10.244.9.7/32"}, strs(want.pods4)); diff != "" {
		t.Errorf("IPv4 pod ranges (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"edge-a", "edge-b", "edge-f", "edge-e"}, want.podOwners4); diff != "" {
		t.Errorf("IPv4 pod range owners (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"fd00:244:0:1::/64", "fd00:244:0:3::/64"}, strs(want.pods6)); diff != "" {
		t.Errorf("IPv6 pod ranges (-want +got):\n%s", diff)
	}
	wantShadowed := []shadowedRange{
		{"edge-c", pfx("10.244.1.0/24"), pfx("10.244.1.0/24"), "edge-a"},
		{"edge-d", pfx("10.244.2.64/26"), pfx("10.244.2.0/24"), "edge-b"},
	}
	if diff := cmp.Diff(wantShadowed, want.shadowed, cmp.AllowUnexported(shadowedRange{}), cmp.Comparer(func(x, y netip.Prefix) bool { return x == y })); diff != "" {
		t.Errorf("shadowed ranges (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		addr  string
		port  uint16
		want  bool
		owner string
	}{
		{"10.244.1.0", 9100, true, "edge-a"},
		{"10.244.1.255", 443, true, "edge-a"},
		{"10.244.2.70", 1, true, "edge-b"},
		{"10.244.5.200", 65535, true, "edge-f"},
		{"10.244.9.7", 80, true, "edge-e"},
		{"10.244.9.8", 80, false, ""},
		{"10.244.0.255", 9100, false, ""},
		{"10.244.3.0", 9100, false, ""},
		{"fd00:244:0:1:ffff:ffff:ffff:ffff", 9100, true, "edge-a"},
		{"fd00:244:0:3::1", 443, true, "edge-f"},
		{"fd00:244:0:2::", 443, false, ""},
		{"fd00:244::ffff", 443, false, ""},
		{"10.20.0.5", 10250, true, ""}, // an edge address on a proxied port
		{"10.20.0.5", 9100, false, ""},
	} {
		a := netip.MustParseAddr(tc.addr)
		if got := want.redirects(a, tc.port); got != tc.want {
			t.Errorf("redirects(%s, %d) = %v, want %v", a, tc.port, got, tc.want)
		}
		if got := want.podOwner(a); got != tc.owner {
			t.Errorf("podOwner(%s) = %q, want %q", a, got, tc.owner)
		}
	}

	// A range that holds others, given last, still wins; a node's own
	// repeated range is one range.
	st := mustNormalize(t, Desired{ProxyPort: 1, PodRanges: map[string][]netip.Prefix{
		"z": {pfx("10.0.0.0/8"), pfx("10.0.0.0/8")},
		"a": {pfx("10.1.0.0/16"), pfx("10.1.2.0/24"), pfx("11.0.0.0/24")},
	}})
	if diff := cmp.Diff([]string{"10.0.0.0/8", "11.0.0.0/24"}, strs(st.pods4)); diff != "" {
		t.Errorf("nested ranges (-want +got):\n%s", diff)
	}
	if len(st.shadowed) != 2 {
		t.Errorf("shadowed = %+v, want a's two ranges inside z's", st.shadowed)
	}
}

func strs[T fmt.Stringer](xs []T) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.String()
	}
	return out
}

func TestRangeKeys(t *testing.T) {
	for _, tc := range []struct {
		rng  string
		want []string // start, then end if any
	}{
		{"10.244.1.0/24", []string{"0af40100 00", "0af40200 01"}},
		{"10.244.9.7/32", []string{"0af40907 00", "0af40908 01"}},
		{"10.0.0.0/7", []string{"0a000000 00", "0c000000 01"}},
		{"255.255.255.0/24", []string{"ffffff00 00"}},
		{"255.255.255.255/32", []string{"ffffffff 00"}},
		{"fd00:244:0:1::/64", []string{"fd000244000000010000000000000000 00", "fd000244000000020000000000000000 01"}},
		{"fd00::1/128", []string{"fd000000000000000000000000000001 00", "fd000000000000000000000000000002 01"}},
		{"ffff:ffff:ffff:ffff::/64", []string{"ffffffffffffffff0000000000000000 00"}},
	} {
		var got []string
		for _, k := range rangeKeys([]netip.Prefix{netip.MustParsePrefix(tc.rng)}) {
			got = append(got, fmt.Sprintf("%x %02x", k[:len(k)-1], k[len(k)-1]))
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.rng, diff)
		}
	}
	// Adjacent ranges are one interval; nft lists an interval as a prefix
	// when it is one.
	var got []string
	ranges := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("10.0.1.0/24"),
		netip.MustParsePrefix("10.0.3.0/24"), netip.MustParsePrefix("10.0.4.0/24"), netip.MustParsePrefix("10.0.6.1/32")}
	for _, k := range rangeKeys(ranges) {
		got = append(got, fmt.Sprintf("%x %02x", k[:len(k)-1], k[len(k)-1]))
	}
	want := []string{"0a000000 00", "0a000200 01", "0a000300 00", "0a000500 01", "0a000601 00", "0a000602 01"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("adjacent ranges (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"10.0.0.0/23", "10.0.3.0-10.0.4.255", "10.0.6.1"}, strs(mergeRanges(ranges))); diff != "" {
		t.Errorf("intervals as nft lists them (-want +got):\n%s", diff)
	}

	// The netlink elements: the flag byte becomes the interval end flag.
	keys := rangeKeys([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")})
	if e := setPods4.setElement(keys[0]); len(e.Key) != 4 || e.IntervalEnd {
		t.Errorf("start element %+v", e)
	}
	if e := setPods4.setElement(keys[1]); len(e.Key) != 4 || !e.IntervalEnd {
		t.Errorf("end element %+v", e)
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
