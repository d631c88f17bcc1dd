package edgetunnel

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// heartbeatGateway answers the delegate-heartbeat streams an edge opens
// on conn with answer's reply (or, if it returns ok false, resets the
// stream) and records the requests.
type heartbeatGateway struct {
	mu   sync.Mutex
	reqs []tunnel.DelegateRequest
}

func serveHeartbeats(t *testing.T, conn *quic.Conn, answer func(tunnel.DelegateRequest) (tunnel.Reply, bool)) *heartbeatGateway {
	t.Helper()
	h := &heartbeatGateway{}
	go func() {
		for {
			s, err := conn.AcceptStream(context.Background())
			if err != nil {
				return
			}
			go func() {
				req, err := tunnel.ReadDelegateRequest(s)
				if err != nil {
					t.Errorf("gateway reads request: %v", err)
					s.CancelRead(0)
					s.CancelWrite(0)
					return
				}
				h.mu.Lock()
				h.reqs = append(h.reqs, req)
				h.mu.Unlock()
				rep, ok := answer(req)
				if !ok {
					s.CancelRead(0)
					s.CancelWrite(0)
					return
				}
				tunnel.WriteReply(s, rep)
				s.Close()
			}()
		}
	}()
	return h
}

func (h *heartbeatGateway) requests() []tunnel.DelegateRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]tunnel.DelegateRequest(nil), h.reqs...)
}

func answerWith(rep tunnel.Reply) func(tunnel.DelegateRequest) (tunnel.Reply, bool) {
	return func(tunnel.DelegateRequest) (tunnel.Reply, bool) { return rep, true }
}

var testLease = []byte(`{"metadata":{"name":"edge-2","namespace":"kube-node-lease"},"spec":{"renewTime":"2025-01-02T03:04:05.000000Z"}}`)

func TestDelegateHeartbeat(t *testing.T) {
	_, gw, e, _ := setup(t, Options{})
	var reply tunnel.Reply
	var mu sync.Mutex
	h := serveHeartbeats(t, gw.nextConn(), func(tunnel.DelegateRequest) (tunnel.Reply, bool) {
		mu.Lock()
		defer mu.Unlock()
		return reply, true
	})
	testenv.Eventually(t, "connected", func() bool { return e.Ready() == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if err := e.DelegateHeartbeat(ctx, "edge-2", testLease); err != nil {
		t.Fatalf("DelegateHeartbeat: %v", err)
	}
	reqs := h.requests()
	if len(reqs) != 1 || reqs[0].Node != "edge-2" || string(reqs[0].Lease) != string(testLease) {
		t.Fatalf("gateway got %+v", reqs)
	}

	mu.Lock()
	reply = tunnel.Reply{Code: tunnel.NotLeader, Message: "pool p is led by edge-3"}
	mu.Unlock()
	err := e.DelegateHeartbeat(ctx, "edge-2", testLease)
	var re *DelegateRefusedError
	if !errors.As(err, &re) || re.Code != tunnel.NotLeader || re.Message != "pool p is led by edge-3" ||
		re.Node != "edge-2" || re.Gateway != gw.addr.String() {
		t.Fatalf("err = %v, want a *DelegateRefusedError not_leader from %s", err, gw.addr)
	}
	if ok, refused := e.metric("tether_edge_tunnel_delegated_heartbeats_total", "result", "ok"),
		e.metric("tether_edge_tunnel_delegated_heartbeats_total", "result", "not_leader"); ok != 1 || refused != 1 {
		t.Errorf("delegated_heartbeats_total: ok %v, not_leader %v; want 1 and 1", ok, refused)
	}
}

func TestDelegateHeartbeatRefusesBadRequestLocally(t *testing.T) {
	_, gw, e, _ := setup(t, Options{})
	h := serveHeartbeats(t, gw.nextConn(), answerWith(tunnel.Reply{Code: tunnel.OK}))
	testenv.Eventually(t, "connected", func() bool { return e.Ready() == nil })
	for name, lease := range map[string][]byte{"no lease": nil, "lease too big": make([]byte, tunnel.MaxLeaseLen+1)} {
		if err := e.DelegateHeartbeat(context.Background(), "edge-2", lease); !errors.Is(err, tunnel.ErrBadHeader) {
			t.Errorf("%s: err = %v, want ErrBadHeader", name, err)
		}
	}
	if err := e.DelegateHeartbeat(context.Background(), "Edge_2", testLease); !errors.Is(err, tunnel.ErrBadHeader) {
		t.Errorf("bad node name: err = %v, want ErrBadHeader", err)
	}
	if reqs := h.requests(); len(reqs) != 0 {
		t.Errorf("gateway got %d requests", len(reqs))
	}
}

func TestDelegateHeartbeatNoGateway(t *testing.T) {
	ca := testenv.MustCA(t, "edgetunnel-test")
	e := startEdge(t, Options{Gateways: []string{closedUDPPort(t)}, AllowPorts: []uint16{1}}, ca, ca)
	if err := e.DelegateHeartbeat(context.Background(), "edge-2", testLease); !errors.Is(err, ErrNoGateway) {
		t.Fatalf("err = %v, want ErrNoGateway", err)
	}
}

// closedUDPPort is a loopback UDP address nothing listens on.
func closedUDPPort(t *testing.T) string {
	t.Helper()
	gw := startGateway(t, gatewayPKI{serverCA: testenv.MustCA(t, "nobody"), clientCA: testenv.MustCA(t, "nobody")}, "127.0.0.1:0")
	addr := gw.addr.String()
	gw.stop()
	return addr
}

// Two replicas: one that cannot serve (unavailable) or whose stream fails
// makes the edge try the other; a refusal about the cluster's objects is
// final.
func TestDelegateHeartbeatReplicas(t *testing.T) {
	for _, tc := range []struct {
		name      string
		first     func(tunnel.DelegateRequest) (tunnel.Reply, bool) // of the replica asked first
		askSecond bool
		wantCode  tunnel.Code // of the final answer; OK: no error
	}{
		{"unavailable", answerWith(tunnel.Reply{Code: tunnel.Unavailable, Message: "apiserver down"}), true, tunnel.OK},
		{"stream reset", func(tunnel.DelegateRequest) (tunnel.Reply, bool) { return tunnel.Reply{}, false }, true, tunnel.OK},
		{"not leader", answerWith(tunnel.Reply{Code: tunnel.NotLeader}), false, tunnel.NotLeader},
		{"other pool", answerWith(tunnel.Reply{Code: tunnel.OtherPool}), false, tunnel.OtherPool},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca := testenv.MustCA(t, "edgetunnel-test")
			gw1 := startGateway(t, gatewayPKI{serverCA: ca, clientCA: ca}, "127.0.0.1:0")
			gw2 := startGateway(t, gatewayPKI{serverCA: ca, clientCA: ca}, "127.0.0.1:0")
			e := startEdge(t, Options{Gateways: []string{gw1.addr.String(), gw2.addr.String()}, AllowPorts: []uint16{1}}, ca, ca)
			// Whichever replica the edge asks first answers as tc says;
			// the other accepts.
			var mu sync.Mutex
			asked := 0
			answer := func(req tunnel.DelegateRequest) (tunnel.Reply, bool) {
				mu.Lock()
				asked++
				n := asked
				mu.Unlock()
				if n == 1 {
					return tc.first(req)
				}
				return tunnel.Reply{Code: tunnel.OK}, true
			}
			serveHeartbeats(t, gw1.nextConn(), answer)
			serveHeartbeats(t, gw2.nextConn(), answer)
			testenv.Eventually(t, "both replicas connected", func() bool {
				st := e.Status()
				return len(st) == 2 && st[0].Connected && st[1].Connected
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := e.DelegateHeartbeat(ctx, "edge-2", testLease)
			var re *DelegateRefusedError
			switch {
			case tc.wantCode == tunnel.OK && err != nil:
				t.Fatalf("err = %v, want the second replica's OK", err)
			case tc.wantCode != tunnel.OK && (!errors.As(err, &re) || re.Code != tc.wantCode):
				t.Fatalf("err = %v, want a %v refusal", err, tc.wantCode)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := map[bool]int{true: 2, false: 1}[tc.askSecond]; asked != want {
				t.Errorf("%d replicas asked, want %d", asked, want)
			}
		})
	}
}

// An attempt is bounded by HeartbeatTimeout: a replica that never answers
// does not hold the caller.
func TestDelegateHeartbeatTimeout(t *testing.T) {
	_, gw, e, _ := setup(t, Options{HeartbeatTimeout: 200 * time.Millisecond})
	block := make(chan struct{})
	defer close(block)
	serveHeartbeats(t, gw.nextConn(), func(tunnel.DelegateRequest) (tunnel.Reply, bool) {
		<-block
		return tunnel.Reply{}, false
	})
	testenv.Eventually(t, "connected", func() bool { return e.Ready() == nil })
	start := time.Now()
	err := e.DelegateHeartbeat(context.Background(), "edge-2", testLease)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("DelegateHeartbeat took %v with a 200ms timeout", d)
	}
	if v := e.metric("tether_edge_tunnel_delegated_heartbeats_total", "result", "error"); v != 1 {
		t.Errorf("delegated_heartbeats_total{result=error} = %v, want 1", v)
	}
}
