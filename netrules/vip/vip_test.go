package vip

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var cmpAddr = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

func nodes(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("edge-%04d", i)
	}
	return out
}

// checkValid checks that every node got a distinct usable address of cidr.
func checkValid(t *testing.T, cidr netip.Prefix, names []string, got map[string]netip.Addr) {
	t.Helper()
	seen := map[netip.Addr]string{}
	for _, n := range names {
		a, ok := got[n]
		if !ok {
			t.Errorf("%s got no address", n)
			continue
		}
		if !(pool{cidr.Masked()}).usable(a) {
			t.Errorf("%s got %v, not a usable address of %v", n, a, cidr)
		}
		if other, dup := seen[a]; dup {
			t.Errorf("%s and %s both got %v", other, n, a)
		}
		seen[a] = n
	}
	if len(got) != len(names) {
		t.Errorf("got %d addresses for %d nodes", len(got), len(names))
	}
}

func TestAssignDeterministic(t *testing.T) {
	cidr := netip.MustParsePrefix("100.100.0.0/16")
	names := nodes(500)
	a, err := Assign(cidr, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkValid(t, cidr, names, a)
	reversed := slices.Clone(names)
	slices.Reverse(reversed)
	b, err := Assign(cidr, append(reversed, names[:10]...), nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a, b, cmpAddr); diff != "" {
		t.Errorf("node order changed the assignment (-sorted +reversed):\n%s", diff)
	}
}

func TestAssignStable(t *testing.T) {
	cidr := netip.MustParsePrefix("100.100.0.0/24")
	names := nodes(100)
	first, err := Assign(cidr, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	// New nodes join, some leave: the others keep their addresses.
	more := append(slices.Clone(names[20:]), "zz-new-1", "aa-new-2")
	second, err := Assign(cidr, more, first)
	if err != nil {
		t.Fatal(err)
	}
	checkValid(t, cidr, more, second)
	for _, n := range names[20:] {
		if second[n] != first[n] {
			t.Errorf("%s moved from %v to %v", n, first[n], second[n])
		}
	}
}

func TestAssignRecorded(t *testing.T) {
	cidr := netip.MustParsePrefix("10.200.0.0/24")
	recorded := map[string]netip.Addr{
		"a":    netip.MustParseAddr("10.200.0.7"),
		"b":    netip.MustParseAddr("10.200.0.7"),        // collides with a: a keeps it
		"c":    netip.MustParseAddr("10.201.0.1"),        // outside the CIDR
		"d":    netip.MustParseAddr("10.200.0.255"),      // broadcast
		"e":    netip.MustParseAddr("10.200.0.0"),        // network
		"f":    netip.MustParseAddr("::ffff:10.200.0.9"), // IPv4-mapped: fine
		"gone": netip.MustParseAddr("10.200.0.10"),       // not a node any more
	}
	names := []string{"a", "b", "c", "d", "e", "f"}
	got, err := Assign(cidr, names, recorded)
	if err != nil {
		t.Fatal(err)
	}
	checkValid(t, cidr, names, got)
	if got["a"] != recorded["a"] || got["f"] != netip.MustParseAddr("10.200.0.9") {
		t.Errorf("valid recorded addresses not kept: %v", got)
	}
	for _, n := range []string{"b", "c", "d", "e"} {
		if got[n] == recorded[n] {
			t.Errorf("%s kept unusable recorded address %v", n, got[n])
		}
	}
}

func TestAssignExhausted(t *testing.T) {
	for _, tc := range []struct {
		cidr   string
		usable int
	}{
		{"192.0.2.0/30", 2}, // network and broadcast reserved
		{"192.0.2.4/31", 2}, // point-to-point: both usable
		{"192.0.2.9/32", 1},
		{"2001:db8::/126", 3}, // subnet-router anycast reserved
		{"2001:db8::/128", 1},
	} {
		cidr := netip.MustParsePrefix(tc.cidr)
		names := nodes(tc.usable)
		got, err := Assign(cidr, names, nil)
		if err != nil {
			t.Errorf("%s: %d nodes: %v", tc.cidr, tc.usable, err)
			continue
		}
		checkValid(t, cidr, names, got)
		names = nodes(tc.usable + 1)
		got, err = Assign(cidr, names, got)
		if !errors.Is(err, ErrExhausted) {
			t.Errorf("%s: %d nodes: got %v, want ErrExhausted", tc.cidr, tc.usable+1, err)
		}
		if len(got) != tc.usable {
			t.Errorf("%s: %d nodes placed, want %d", tc.cidr, len(got), tc.usable)
		}
	}
}

func TestAssignIPv6Large(t *testing.T) {
	cidr := netip.MustParsePrefix("fd00:7e7e::/48")
	names := nodes(1000)
	got, err := Assign(cidr, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkValid(t, cidr, names, got)
}

func TestAssignMany(t *testing.T) {
	cidr := netip.MustParsePrefix("100.64.0.0/18") // 16382 usable
	names := nodes(10000)
	got, err := Assign(cidr, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkValid(t, cidr, names, got)
	// Re-running with the result recorded changes nothing.
	again, err := Assign(cidr, names, maps.Clone(got))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, again, cmpAddr); diff != "" {
		t.Errorf("second run differs:\n%s", diff)
	}
}

func TestAssignInvalid(t *testing.T) {
	if _, err := Assign(netip.Prefix{}, nodes(1), nil); err == nil {
		t.Error("invalid CIDR accepted")
	}
}
