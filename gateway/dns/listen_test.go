package dns

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestServeTCP checks several queries on one TCP connection, no answer and
// a closed connection for garbage, and that Serve returns once ctx is done
// even with a client connection still open.
func TestServeTCP(t *testing.T) {
	s := newTestServer(t, Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, pc, ln) }()

	c, err := dns.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	for _, name := range []string{"edge-1.tether.internal.", "edge-2.", "nope.tether.internal."} {
		if err := c.WriteMsg(query(name, dns.TypeA, 0)); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []int{dns.RcodeSuccess, dns.RcodeSuccess, dns.RcodeNameError} {
		r, err := c.ReadMsg()
		if err != nil {
			t.Fatal(err)
		}
		if r.Rcode != want {
			t.Errorf("rcode %s, want %s", dns.RcodeToString[r.Rcode], dns.RcodeToString[want])
		}
	}

	// UDP on the same server.
	uc, err := dns.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	uc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := uc.WriteMsg(query("edge-1.", dns.TypeA, 0)); err != nil {
		t.Fatal(err)
	}
	if r, err := uc.ReadMsg(); err != nil || len(r.Answer) != 1 {
		t.Fatalf("udp: %v %v", r, err)
	}

	// Garbage on TCP: no answer, the connection is closed.
	if _, err := c.Write([]byte{0, 3, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadMsg(); err == nil {
		t.Error("an answer to garbage")
	}

	// A client Serve has accepted (it answered), then idle: Serve still
	// returns at cancel.
	idle, err := dns.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	idle.SetDeadline(time.Now().Add(5 * time.Second))
	if err := idle.WriteMsg(query("edge-1.", dns.TypeA, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := idle.ReadMsg(); err != nil {
		t.Fatalf("the idle client's first query: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel with an idle TCP client")
	}
}

func TestListenAndServe(t *testing.T) {
	serving := make(chan string, 1)
	s := newTestServer(t, Options{Logger: slog.New(servingAddr{serving})})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.ListenAndServe(ctx, "127.0.0.1:0") }()
	var addr string
	select {
	case addr = <-serving:
	case err := <-done:
		t.Fatalf("ListenAndServe: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("ListenAndServe did not say it serves within 30 s")
	}
	// It answers on the port it logged, over UDP and TCP.
	for _, network := range []string{"udp", "tcp"} {
		c, err := dns.Dial(network, addr)
		if err != nil {
			t.Fatalf("%s %s: %v", network, addr, err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if err := c.WriteMsg(query("edge-1.", dns.TypeA, 0)); err != nil {
			t.Fatal(err)
		}
		if r, err := c.ReadMsg(); err != nil || len(r.Answer) != 1 {
			t.Errorf("%s query to %s: %v, %v", network, addr, r, err)
		}
		c.Close()
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("ListenAndServe: %v", err)
	}
	if err := s.ListenAndServe(t.Context(), "192.0.2.1:53"); err == nil {
		t.Error("ListenAndServe on an address not on this host did not fail")
	}
}

func TestValidate(t *testing.T) {
	good := Options{Zones: []string{"tether.internal", "64.100.in-addr.arpa."}, Mode: "vip", TTL: time.Second}
	if err := good.Validate(); err != nil {
		t.Errorf("valid options: %v", err)
	}
	for _, bad := range []Options{
		{Zones: []string{"."}},
		{Zones: []string{"a..b"}},
		{Mode: "nodeip"},
		{TTL: -time.Second},
		{MaxUDPSize: 100},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// servingAddr is a log handler that passes on the address of
// ListenAndServe's "serving dns".
type servingAddr struct{ ch chan<- string }

func (h servingAddr) Enabled(context.Context, slog.Level) bool { return true }

func (h servingAddr) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "serving dns" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "addr" {
			select {
			case h.ch <- a.Value.String():
			default:
			}
		}
		return true
	})
	return nil
}

func (h servingAddr) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h servingAddr) WithGroup(string) slog.Handler      { return h }
