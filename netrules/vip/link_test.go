package vip

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/netrules"
)

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, x := range s {
		out = append(out, netip.MustParseAddr(x))
	}
	return out
}

// linkAddrs returns the VIPs tether0 holds in h, sorted.
func linkAddrs(t *testing.T, h *testenv.Host) []netip.Addr {
	t.Helper()
	var got []netip.Addr
	if err := h.Do(func() (err error) { got, err = Link{}.Addrs(); return err }); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, netip.Addr.Compare)
	return got
}

func TestKernelLink(t *testing.T) {
	testenv.RequireRoot(t)
	h := testenv.NewHost(t, "nr-vip")
	sync := func(as []netip.Addr) {
		t.Helper()
		if err := h.Do(func() error { return Link{}.Sync(as) }); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(as, linkAddrs(t, h), cmpAddr); diff != "" {
			t.Errorf("tether0 holds (-want +got):\n%s", diff)
		}
	}

	sync(addrs("100.100.0.1", "100.100.0.2", "fd00:7e7e::1"))
	link := h.Run(t, "ip", "-d", "link", "show", LinkName)
	if !strings.Contains(link, ",UP") || !(strings.Contains(link, "dummy") || strings.Contains(link, "ifb")) {
		t.Errorf("tether0 is not an up dummy (or ifb):\n%s", link)
	}
	if got := h.Run(t, "ip", "addr", "show", "dev", LinkName); !strings.Contains(got, "100.100.0.1/32") || !strings.Contains(got, "fd00:7e7e::1/128") {
		t.Errorf("VIPs are not host addresses:\n%s", got)
	}
	// The VIPs are local addresses: connections to them stay on the host.
	ln, err := h.Listen("tcp", "100.100.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := h.DialContext(t.Context(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial a VIP: %v", err)
	}
	c.Close()

	// An address someone else added goes; the set is exactly what is asked.
	h.Run(t, "ip", "addr", "add", "10.9.9.9/24", "dev", LinkName)
	sync(addrs("100.100.0.2", "100.100.0.3", "fd00:7e7e::2"))
	sync(nil)
	sync(addrs("100.100.0.4"))

	if err := h.Do(Link{}.Delete); err != nil {
		t.Fatal(err)
	}
	if out, err := h.Command(t.Context(), "ip", "link", "show", LinkName).CombinedOutput(); err == nil {
		t.Errorf("tether0 still there after Delete:\n%s", out)
	}
	if err := h.Do(Link{}.Delete); err != nil {
		t.Errorf("Delete of a missing link: %v", err)
	}
}

func TestKernelLinkConflict(t *testing.T) {
	testenv.RequireRoot(t)
	h := testenv.NewHost(t, "nr-vip")
	h.Run(t, "ip", "link", "add", LinkName, "type", "veth", "peer", "name", "other0")
	for name, fn := range map[string]func() error{
		"Sync":   func() error { return Link{}.Sync(addrs("100.100.0.1")) },
		"Delete": Link{}.Delete,
	} {
		if err := h.Do(fn); !errors.Is(err, netrules.ErrConflict) {
			t.Errorf("%s on a veth named tether0: got %v, want ErrConflict", name, err)
		}
	}
	if out := h.Run(t, "ip", "addr", "show", "dev", LinkName); strings.Contains(out, "100.100.0.1") {
		t.Errorf("foreign link changed:\n%s", out)
	}
}
