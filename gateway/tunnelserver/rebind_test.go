package tunnelserver

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-edge/tether/gateway/internal/edgetest"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// nat is a UDP relay in front of the gateway, as an edge site's NAT: the
// edge dials its inside address and the gateway sees the relay's outside
// socket, which rebind replaces by one on another port (a NAT rebinding).
type nat struct {
	t       *testing.T
	inside  *net.UDPConn
	server  *net.UDPAddr
	client  atomic.Pointer[net.UDPAddr]
	outside atomic.Pointer[net.UDPConn]
	mu      sync.Mutex
	all     []*net.UDPConn // every outside socket, closed at cleanup
	wg      sync.WaitGroup
}

func startNAT(t *testing.T, server net.Addr) *nat {
	t.Helper()
	inside, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	n := &nat{t: t, inside: inside, server: server.(*net.UDPAddr)}
	n.rebind()
	n.wg.Add(1)
	go func() { // edge to gateway, through the current outside socket
		defer n.wg.Done()
		buf := make([]byte, 65536)
		for {
			k, from, err := inside.ReadFromUDP(buf)
			if err != nil {
				return
			}
			n.client.Store(from)
			n.outside.Load().WriteToUDP(buf[:k], n.server)
		}
	}()
	t.Cleanup(func() {
		inside.Close()
		n.mu.Lock()
		for _, c := range n.all {
			c.Close()
		}
		n.mu.Unlock()
		n.wg.Wait()
	})
	return n
}

// rebind sends the edge's packets from a new outside socket from now on;
// the gateway's answers to any of them still reach the edge.
func (n *nat) rebind() *net.UDPAddr {
	n.t.Helper()
	out, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		n.t.Fatal(err)
	}
	n.mu.Lock()
	n.all = append(n.all, out)
	n.mu.Unlock()
	n.outside.Store(out)
	n.wg.Add(1)
	go func() { // gateway to edge
		defer n.wg.Done()
		buf := make([]byte, 65536)
		for {
			k, _, err := out.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if c := n.client.Load(); c != nil {
				n.inside.WriteToUDP(buf[:k], c)
			}
		}
	}()
	return out.LocalAddr().(*net.UDPAddr)
}

// After the edge's NAT rebinds, the connection lives on and /status shows
// the edge's new address.
func TestStatusFollowsNATRebinding(t *testing.T) {
	f := start(t, 0)
	n := startNAT(t, f.srv.Addr())
	kp, err := f.ca.NodeCert("edge-1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	edge, err := edgetest.Dial(ctx, n.inside.LocalAddr().String(), edgetest.Options{
		Cert: kp.TLS, Roots: f.ca.Pool(), ServerName: "gateway",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(edge.Close)
	testenv.Eventually(t, "edge-1 is registered", func() bool { _, ok := f.reg.Lookup("edge-1"); return ok })
	e, _ := f.reg.Lookup("edge-1")
	first := n.outside.Load().LocalAddr().String()
	if got := e.Status().Remote; got != first {
		t.Fatalf("remote %s, want the NAT's outside address %s", got, first)
	}

	second := n.rebind().String()
	// The edge sends: probes are answered, so they go both ways.
	testenv.Eventually(t, "the gateway's status shows the edge's new address "+second, func() bool {
		if rep, err := delegate(t, edge, tunnel.AppendProbeRequest(nil)); err != nil || rep.Code != tunnel.OK {
			t.Fatalf("probe after the rebinding answered %+v, %v", rep, err)
		}
		return e.Status().Remote == second
	})
	if cur, _ := f.reg.Lookup("edge-1"); cur != e || edge.Conn().Context().Err() != nil {
		t.Fatal("the connection did not survive the rebinding")
	}
}
