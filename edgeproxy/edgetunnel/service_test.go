package edgetunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// serveServices answers the service streams an edge opens on conn with
// answer's reply; after an OK one it echoes what it reads, prefixed
// with "got ", once the edge half-closed, as a Service would.
func serveServices(t *testing.T, conn *quic.Conn, answer func(tunnel.ServiceRequest) tunnel.Reply) {
	t.Helper()
	go func() {
		for {
			s, err := conn.AcceptStream(context.Background())
			if err != nil {
				return
			}
			go func() {
				req, err := tunnel.ReadEdgeRequest(s)
				if err != nil || req.Service == nil {
					t.Errorf("gateway reads request: %+v, %v", req, err)
					s.CancelRead(0)
					s.CancelWrite(0)
					return
				}
				rep := answer(*req.Service)
				tunnel.WriteReply(s, rep)
				if rep.Code != tunnel.OK {
					s.Close()
					s.CancelRead(0)
					return
				}
				in, err := io.ReadAll(s)
				if err != nil {
					s.CancelWrite(0)
					return
				}
				s.Write(append([]byte("got "), in...))
				s.Close()
			}()
		}
	}()
}

var testService = tunnel.ServiceRequest{Namespace: "shop", Name: "orders", Port: 8080}

// A service stream carries the connection's bytes both ways, with a
// half-close, after the gateway's OK.
func TestDialService(t *testing.T) {
	_, gw, e, _ := setup(t, Options{})
	got := make(chan tunnel.ServiceRequest, 1)
	serveServices(t, gw.nextConn(), func(req tunnel.ServiceRequest) tunnel.Reply {
		got <- req
		return tunnel.Reply{Code: tunnel.OK}
	})
	testenv.Eventually(t, "connected", func() bool { return e.Ready() == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	s, err := e.DialService(ctx, testService)
	if err != nil {
		t.Fatalf("DialService: %v", err)
	}
	defer s.Release()
	if req := <-got; req != testService {
		t.Errorf("gateway got %v, want %v", req, testService)
	}
	if s.Gateway != gw.addr {
		t.Errorf("Gateway = %v, want %v", s.Gateway, gw.addr)
	}
	// Through tunnel.Relay, as the edge's service listener uses it.
	a, b := tcpPair(t)
	done := make(chan error, 1)
	go func() { done <- tunnel.Relay(b, s, tunnel.RelayOptions{}) }()
	a.Write([]byte("hello"))
	a.CloseWrite()
	a.SetReadDeadline(time.Now().Add(10 * time.Second))
	if out, err := io.ReadAll(a); string(out) != "got hello" || err != nil {
		t.Fatalf("through the stream: %q, %v", out, err)
	}
	if err := <-done; err != nil {
		t.Errorf("Relay: %v", err)
	}
}

// tcpPair is both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

// A refusal that every replica would repeat is final; one that is the
// replica's own state sends the stream to the next replica.
func TestDialServiceReplicas(t *testing.T) {
	for _, tc := range []struct {
		first     tunnel.Code
		askSecond bool
	}{
		{tunnel.NotMarked, false},
		{tunnel.NoEndpoints, false},
		{tunnel.DialFailed, false},
		{tunnel.Overloaded, true},
		{tunnel.RateLimited, true},
		{tunnel.Unavailable, true},
	} {
		t.Run(tc.first.String(), func(t *testing.T) {
			ca := testenv.MustCA(t, "edgetunnel-test")
			gw1 := startGateway(t, gatewayPKI{serverCA: ca, clientCA: ca}, "127.0.0.1:0")
			gw2 := startGateway(t, gatewayPKI{serverCA: ca, clientCA: ca}, "127.0.0.1:0")
			e := startEdge(t, Options{Gateways: []string{gw1.addr.String(), gw2.addr.String()}, AllowPorts: []uint16{1}}, ca, ca)
			var mu sync.Mutex
			asked := 0
			answer := func(tunnel.ServiceRequest) tunnel.Reply {
				mu.Lock()
				defer mu.Unlock()
				asked++
				if asked == 1 {
					return tunnel.Reply{Code: tc.first, Message: "first"}
				}
				return tunnel.Reply{Code: tunnel.OK}
			}
			serveServices(t, gw1.nextConn(), answer)
			serveServices(t, gw2.nextConn(), answer)
			testenv.Eventually(t, "both replicas connected", func() bool {
				st := e.Status()
				return len(st) == 2 && st[0].Connected && st[1].Connected
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := e.DialService(ctx, testService)
			var re *tunnel.RefusedError
			switch {
			case tc.askSecond && err != nil:
				t.Fatalf("DialService: %v; want the second replica's stream", err)
			case tc.askSecond:
				s.Release()
			case !errors.As(err, &re) || re.Code != tc.first || re.Message != "first":
				t.Fatalf("DialService: %v; want a *tunnel.RefusedError %v", err, tc.first)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := map[bool]int{true: 2, false: 1}[tc.askSecond]; asked != want {
				t.Errorf("%d replicas asked, want %d", asked, want)
			}
		})
	}
}

// The edge's service streams toward a replica are bounded by
// MaxServiceStreams: past it DialService refuses at once as Overloaded
// without opening a stream, and a released stream frees its slot.
func TestDialServiceSlots(t *testing.T) {
	_, gw, e, _ := setup(t, Options{MaxServiceStreams: 2})
	var mu sync.Mutex
	asked := 0
	serveServices(t, gw.nextConn(), func(tunnel.ServiceRequest) tunnel.Reply {
		mu.Lock()
		defer mu.Unlock()
		asked++
		return tunnel.Reply{Code: tunnel.OK}
	})
	testenv.Eventually(t, "connected", func() bool { return e.Ready() == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var open []*ServiceStream
	for range 2 {
		s, err := e.DialService(ctx, testService)
		if err != nil {
			t.Fatalf("DialService: %v", err)
		}
		open = append(open, s)
	}
	_, err := e.DialService(ctx, testService)
	var re *tunnel.RefusedError
	if !errors.As(err, &re) || re.Code != tunnel.Overloaded {
		t.Fatalf("third DialService: %v, want Overloaded", err)
	}
	mu.Lock()
	if asked != 2 {
		t.Errorf("gateway asked %d times, want 2 (the third refused by the edge)", asked)
	}
	mu.Unlock()
	open[0].Release()
	open[0].Release() // twice is harmless
	s, err := e.DialService(ctx, testService)
	if err != nil {
		t.Fatalf("DialService after a Release: %v", err)
	}
	s.Release()
	open[1].Release()
}

func TestDialServiceNoGateway(t *testing.T) {
	ca := testenv.MustCA(t, "edgetunnel-test")
	e := startEdge(t, Options{Gateways: []string{closedPort(t).String()}, AllowPorts: []uint16{1}}, ca, ca)
	if _, err := e.DialService(context.Background(), testService); !errors.Is(err, ErrNoGateway) {
		t.Errorf("DialService: %v, want ErrNoGateway", err)
	}
	if _, err := e.DialService(context.Background(), tunnel.ServiceRequest{Namespace: "Bad", Name: "x", Port: 1}); !errors.Is(err, tunnel.ErrBadHeader) {
		t.Errorf("bad request: %v, want ErrBadHeader", err)
	}
}
