package netrules

import (
	"net"
	"net/netip"
	"testing"

	"github.com/tether-edge/tether/internal/testenv"
)

// TestKernelOriginalDst checks OriginalDst on IPv4-only and IPv6-only
// listeners (TestKernel covers dual-stack ones), for redirected
// connections and for one that was not.
func TestKernelOriginalDst(t *testing.T) {
	testenv.RequireRoot(t)
	h := testenv.NewHost(t, "nr-origdst")
	h.Run(t, "nft", "add table inet t { chain o { type nat hook output priority -100; tcp dport 7000 redirect to :7001; }; }")
	for _, tc := range []struct {
		network, listen, dial string
		want                  string
	}{
		{"tcp4", "0.0.0.0:7001", "127.0.0.1:7000", "127.0.0.1:7000"},
		{"tcp6", "[::]:7001", "[::1]:7000", "[::1]:7000"},
		{"tcp4", "0.0.0.0:7001", "127.0.0.1:7001", "127.0.0.1:7001"}, // not redirected
	} {
		ln, err := h.Listen(tc.network, tc.listen)
		if err != nil {
			t.Fatal(err)
		}
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}()
		c, err := h.DialContext(t.Context(), "tcp", tc.dial)
		if err != nil {
			t.Fatal(err)
		}
		s, ok := <-accepted
		if !ok {
			t.Fatal("accept failed")
		}
		got, err := OriginalDst(s.(*net.TCPConn))
		if err != nil {
			t.Errorf("%s %s: %v", tc.network, tc.dial, err)
		} else if got != netip.MustParseAddrPort(tc.want) {
			t.Errorf("%s %s: original destination %v, want %s", tc.network, tc.dial, got, tc.want)
		}
		c.Close()
		s.Close()
		ln.Close()
	}
}
