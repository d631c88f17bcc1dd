package edgeservice

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/edgeaccess"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// fakeRanges are fixed pod ranges.
type fakeRanges []netip.Prefix

func (f fakeRanges) PodRanges() ([]netip.Prefix, bool) { return f, true }

type fakeAddrs []netip.Addr

func (f fakeAddrs) Addrs() ([]netip.Addr, error) { return f, nil }

// tcpStream is a Stream over a TCP connection to a fake Service.
type tcpStream struct {
	c        *net.TCPConn
	released chan struct{}
	once     sync.Once
}

func (s *tcpStream) Read(p []byte) (int, error)       { return s.c.Read(p) }
func (s *tcpStream) Write(p []byte) (int, error)      { return s.c.Write(p) }
func (s *tcpStream) Close() error                     { return s.c.CloseWrite() }
func (s *tcpStream) CancelRead(quic.StreamErrorCode)  { s.c.CloseRead() }
func (s *tcpStream) CancelWrite(quic.StreamErrorCode) { s.c.Close() }
func (s *tcpStream) Release()                         { s.once.Do(func() { s.c.Close(); close(s.released) }) }

// fakeDialer answers every request with reply; on OK it connects to an
// echo server that answers "got <what it read>".
type fakeDialer struct {
	t     *testing.T
	reply tunnel.Code
	echo  string
	mu    sync.Mutex
	reqs  []tunnel.ServiceRequest
	rel   chan struct{}
}

func (d *fakeDialer) DialService(ctx context.Context, req tunnel.ServiceRequest) (Stream, error) {
	d.mu.Lock()
	d.reqs = append(d.reqs, req)
	d.mu.Unlock()
	if d.reply != tunnel.OK {
		return nil, &tunnel.RefusedError{Code: d.reply}
	}
	c, err := net.Dial("tcp", d.echo)
	if err != nil {
		return nil, err
	}
	return &tcpStream{c: c.(*net.TCPConn), released: d.rel}, nil
}

func (d *fakeDialer) asked() []tunnel.ServiceRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]tunnel.ServiceRequest(nil), d.reqs...)
}

var (
	marked   = netip.MustParseAddrPort("10.96.0.10:80")
	unmarked = netip.MustParseAddrPort("10.96.0.11:80")
)

func testIndex() *Index {
	ix := &Index{}
	ix.Set([]*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders", Annotations: map[string]string{edgeaccess.Annotation: "true"}},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00:96::10"},
				Ports: []corev1.ServicePort{{Port: 80}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "secret"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.11", Ports: []corev1.ServicePort{{Port: 80}}}},
	})
	return ix
}

type served struct {
	addr string
	reg  *prometheus.Registry
	d    *fakeDialer
}

// serve runs a Server whose connections all seem redirected from dst.
func serve(t *testing.T, reply tunnel.Code, dst netip.AddrPort) *served {
	t.Helper()
	d := &fakeDialer{t: t, reply: reply, echo: testenv.GotServer(t).String(), rel: make(chan struct{})}
	reg := prometheus.NewRegistry()
	s, err := New(Options{Index: testIndex(), Dialer: d, Pods: fakeRanges{netip.MustParsePrefix("10.244.1.0/24")},
		LocalAddrs: fakeAddrs{netip.MustParseAddr("192.168.1.20")}, Registry: reg,
		OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) { return dst, nil }})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &served{addr: ln.Addr().String(), reg: reg, d: d}
}

// roundTrip sends msg, half-closes and reads the answer.
func roundTrip(t *testing.T, addr, msg string) (string, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return "", err // a reset may come before connect returns
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	c.(*net.TCPConn).CloseWrite()
	out, err := io.ReadAll(c)
	return string(out), err
}

func TestServeMarked(t *testing.T) {
	s := serve(t, tunnel.OK, marked)
	out, err := roundTrip(t, s.addr, "hello")
	if out != "got hello" || err != nil {
		t.Fatalf("through the listener: %q, %v", out, err)
	}
	if got := s.d.asked(); len(got) != 1 || got[0] != (tunnel.ServiceRequest{Namespace: "shop", Name: "orders", Port: 80}) {
		t.Errorf("asked %v", got)
	}
	select {
	case <-s.d.rel:
	case <-time.After(10 * time.Second):
		t.Fatal("stream not released")
	}
	if n := counter(t, s.reg, "tether_edge_service_streams_total", "ok"); n != 1 {
		t.Errorf("streams ok = %v, want 1", n)
	}
}

// An unmarked ClusterIP is reset before any stream is asked for.
func TestServeNotMarked(t *testing.T) {
	s := serve(t, tunnel.OK, unmarked)
	if out, err := roundTrip(t, s.addr, "hello"); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("unmarked destination: %q, %v; want a reset", out, err)
	}
	if got := s.d.asked(); len(got) != 0 {
		t.Errorf("asked the gateway for %v", got)
	}
	if n := counter(t, s.reg, "tether_edge_service_refusals_total", ReasonNotMarked); n != 1 {
		t.Errorf("refusals not_marked = %v, want 1", n)
	}
}

// The gateway's refusal resets the pod's connection and is counted by
// its code.
func TestServeRefused(t *testing.T) {
	s := serve(t, tunnel.NoEndpoints, marked)
	if out, err := roundTrip(t, s.addr, "hello"); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("refused: %q, %v; want a reset", out, err)
	}
	if n := counter(t, s.reg, "tether_edge_service_streams_total", "no_endpoints"); n != 1 {
		t.Errorf("streams no_endpoints = %v, want 1", n)
	}
}

// Only this node's pods, the node itself and loopback may use the
// listener: a LAN host that reaches the node address is refused.
func TestAdmitsSource(t *testing.T) {
	s, err := New(Options{Index: &Index{}, Dialer: &fakeDialer{}, Pods: fakeRanges{netip.MustParsePrefix("10.244.1.0/24")},
		LocalAddrs: fakeAddrs{netip.MustParseAddr("192.168.1.20")}})
	if err != nil {
		t.Fatal(err)
	}
	for a, want := range map[string]bool{
		"127.0.0.1": true, "::1": true, "10.244.1.7": true, "192.168.1.20": true,
		"192.168.1.21": false, "10.244.2.7": false, "fd00::1": false,
	} {
		if got := s.admits(netip.MustParseAddr(a)); got != want {
			t.Errorf("admits(%s) = %v, want %v", a, got, want)
		}
	}
}

// counter reads one series of a counter vector; -1 if absent.
func counter(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// A host that is no pod of this node and not the node itself (here: an
// address of this machine's that the server does not count as the
// node's, as a LAN host's) is reset before its destination is looked at.
func TestServeSourceRefused(t *testing.T) {
	var src netip.Addr
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			src = p.Addr()
			break
		}
	}
	if !src.IsValid() {
		t.Skip("no IPv4 address besides loopback")
	}
	d := &fakeDialer{reply: tunnel.OK, echo: testenv.GotServer(t).String(), rel: make(chan struct{})}
	reg := prometheus.NewRegistry()
	origDst := 0
	s, err := New(Options{Index: testIndex(), Dialer: d, Pods: fakeRanges{netip.MustParsePrefix("10.244.1.0/24")},
		LocalAddrs: fakeAddrs{netip.MustParseAddr("192.0.2.1")}, Registry: reg,
		OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) { origDst++; return marked, nil }})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(src, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	if out, err := roundTrip(t, ln.Addr().String(), "hello"); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("from %s: %q, %v; want a reset", src, out, err)
	}
	if n := counter(t, reg, "tether_edge_service_refusals_total", ReasonSource); n != 1 {
		t.Errorf("refusals source = %v, want 1", n)
	}
	if len(d.asked()) != 0 || origDst != 0 {
		t.Errorf("a refused source got as far as the destination (%d) or the gateway (%v)", origDst, d.asked())
	}
}
