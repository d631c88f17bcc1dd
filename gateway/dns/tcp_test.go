package dns

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/internal/accept/accepttest"
	"github.com/tether-edge/tether/internal/testenv"
)

// serving runs s.Serve on loopback sockets until the test ends, its TCP
// listener wrapped by wrap when given, and returns their address (UDP and
// TCP) and Serve's result, which must not arrive before the test ends.
func serving(t *testing.T, s *Server, wrap func(net.Listener) net.Listener) (addr string, done <-chan error) {
	t.Helper()
	pc, ln, err := Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		ln = wrap(ln)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- s.Serve(ctx, pc, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ch; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return pc.LocalAddr().String(), ch
}

// dialFrom opens a DNS TCP connection to addr from the loopback address
// from (127.0.0.x: each is a source of its own).
func dialFrom(t *testing.T, from, addr string) *dns.Conn {
	t.Helper()
	c, err := dial(from, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &dns.Conn{Conn: c}
}

func dial(from, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second,
		// The port is picked at connect, knowing the server's end, so
		// that it never meets a TIME_WAIT of an earlier test's tuple.
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
			})
			return errors.Join(err, serr)
		}}
	return d.Dial("tcp", addr)
}

// refusedFrom connects to addr from the loopback address from and reports
// nil if the server resets or closes the connection without an answer
// (on loopback the reset may even beat the end of connect).
func refusedFrom(from, addr string) error {
	c, err := dial(from, addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	if err != nil {
		return err
	}
	defer c.Close()
	return closedByServer(c)
}

// ask sends a query for edge-1 on c and reads the answer.
func ask(c *dns.Conn) error {
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := c.WriteMsg(query("edge-1.", dns.TypeA, 0)); err != nil {
		return err
	}
	r, err := c.ReadMsg()
	if err != nil {
		return err
	}
	if len(r.Answer) != 1 {
		return errors.New("no answer for edge-1")
	}
	return nil
}

// closedByServer reports how c ended: nil if the server reset or closed it
// without an answer within the (generous) deadline.
func closedByServer(c net.Conn) error {
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var b [1]byte
	_, err := c.Read(b[:])
	switch {
	case err == nil:
		return errors.New("the server sent bytes")
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errors.New("the server kept the connection open")
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
		return nil
	}
	return err
}

func metricValue(t *testing.T, c prometheus.Collector, name string, labels ...string) float64 {
	t.Helper()
	v, err := metrictest.Value(c, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// An accept that fails as it does out of file descriptors does not end
// Serve: UDP is answered meanwhile, the TCP client that connected during
// the failures is answered once they stop, and each failure is counted.
func TestServeAcceptErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newTestServer(t, Options{Registerer: reg})
	var fl *accepttest.Listener
	addr, done := serving(t, s, func(ln net.Listener) net.Listener {
		fl = accepttest.New(ln, true)
		return fl
	})

	tc := dialFrom(t, "127.0.0.1", addr)
	answered := make(chan error, 1)
	go func() { answered <- ask(tc) }()
	testenv.Eventually(t, "Accept failed three times", func() bool { return fl.Failures() >= 3 })
	uc, err := dns.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	if err := ask(uc); err != nil {
		t.Fatalf("UDP while TCP accepts fail: %v", err)
	}

	fl.SetFailing(false)
	if err := <-answered; err != nil {
		t.Fatalf("TCP query sent while accepts failed: %v", err)
	}
	if err := ask(dialFrom(t, "127.0.0.1", addr)); err != nil {
		t.Fatalf("TCP after the failures: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("Serve returned %v", err)
	default:
	}
	if n := metricValue(t, s.metrics.acceptTCP, "tether_gateway_accept_errors_total", "listener=dns_tcp"); n != float64(fl.Failures()) {
		t.Errorf("accept errors counted %v, want %d", n, fl.Failures())
	}
}

// The connection caps, per source address and overall, on real TCP from
// several loopback addresses: a connection past one is reset at once,
// counted by reason and logged; a freed slot is taken again.
func TestTCPLimits(t *testing.T) {
	logs := &logRecorder{}
	s := newTestServer(t, Options{MaxTCPConns: 4, MaxTCPConnsPerSource: 2, Logger: slog.New(logs), Registerer: prometheus.NewRegistry()})
	addr, _ := serving(t, s, nil)
	open := func() float64 { return metricValue(t, s.metrics.tcpOpen, "tether_gateway_dns_tcp_connections") }
	perSource := func() float64 {
		return metricValue(t, s.metrics.refusedSrc, "tether_gateway_dns_tcp_refusals_total", "reason="+ReasonMaxConnsPerSource)
	}
	overall := func() float64 {
		return metricValue(t, s.metrics.refusedMax, "tether_gateway_dns_tcp_refusals_total", "reason="+ReasonMaxConns)
	}

	a1, a2 := dialFrom(t, "127.0.0.2", addr), dialFrom(t, "127.0.0.2", addr)
	for _, c := range []*dns.Conn{a1, a2} {
		if err := ask(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := refusedFrom("127.0.0.2", addr); err != nil {
		t.Fatalf("a third connection from 127.0.0.2: %v", err)
	}
	if perSource() != 1 || overall() != 0 {
		t.Fatalf("refusals per source %v, overall %v; want 1, 0", perSource(), overall())
	}

	// Another source still gets its two, up to the cap of four.
	for range 2 {
		if err := ask(dialFrom(t, "127.0.0.3", addr)); err != nil {
			t.Fatal(err)
		}
	}
	if got := open(); got != 4 {
		t.Fatalf("%v connections open, want 4", got)
	}
	if err := refusedFrom("127.0.0.4", addr); err != nil {
		t.Fatalf("a fifth connection: %v", err)
	}
	if perSource() != 1 || overall() != 1 {
		t.Fatalf("refusals per source %v, overall %v; want 1, 1", perSource(), overall())
	}

	// A slot freed is taken again, and 127.0.0.2 may open one more.
	a1.Close()
	testenv.Eventually(t, "the server sees the close", func() bool { return open() == 3 })
	if err := ask(dialFrom(t, "127.0.0.2", addr)); err != nil {
		t.Fatalf("after a close: %v", err)
	}

	var lines []string
	for _, l := range logs.take() {
		if strings.HasPrefix(l, "dns tcp connection refused") {
			lines = append(lines, l)
		}
	}
	want := []string{
		"dns tcp connection refused source=127.0.0.2 reason=max_connections_per_source suppressed=0",
		"dns tcp connection refused source=127.0.0.4 reason=max_connections suppressed=0",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("refusals logged:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// A connection that sends nothing, or announces a query and sends only a
// part of it, is closed after the idle timeout, unanswered.
func TestTCPIdleTimeout(t *testing.T) {
	s := newTestServer(t, Options{TCPIdleTimeout: 100 * time.Millisecond, Registerer: prometheus.NewRegistry()})
	addr, _ := serving(t, s, nil)
	silent := dialFrom(t, "127.0.0.1", addr)
	partial := dialFrom(t, "127.0.0.1", addr)
	if _, err := partial.Write([]byte{0xff, 0xff, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]net.Conn{"silent": silent, "partial": partial} {
		if err := closedByServer(c); err != nil {
			t.Errorf("%s connection: %v", name, err)
		}
	}
	testenv.Eventually(t, "no connection open", func() bool {
		return metricValue(t, s.metrics.tcpOpen, "tether_gateway_dns_tcp_connections") == 0
	})
}

// Idle connections hold no query buffers: 200 connections that each had a
// query answered and stay open cost far less heap than the 128 KiB a
// session of buffers takes.
func TestTCPIdleMemory(t *testing.T) {
	const conns = 200
	s := newTestServer(t, Options{MaxTCPConnsPerSource: conns, Registerer: prometheus.NewRegistry()})
	addr, _ := serving(t, s, nil)
	heap := func() uint64 {
		runtime.GC()
		runtime.GC() // and the sync.Pool's victims
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	for range conns {
		if err := ask(dialFrom(t, "127.0.0.1", addr)); err != nil {
			t.Fatal(err)
		}
	}
	after := heap()
	if grown := int64(after) - int64(before); grown > conns*16<<10 {
		t.Errorf("heap grew by %d KiB for %d idle connections (%d KiB each), want under 16 KiB each",
			grown>>10, conns, grown/conns>>10)
	}
}
