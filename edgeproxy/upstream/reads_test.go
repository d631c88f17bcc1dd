package upstream

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tether-edge/tether/internal/testenv"
)

// readsServer answers /who with the protocol, the client's address and
// certificate; /gzip with a gzip body; /close with Connection: close;
// /big with 1 MiB; /hang until the request ends.
func readsServer(t *testing.T) (*httptest.Server, chan struct{}) {
	t.Helper()
	hangEnded := make(chan struct{}, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/who":
			fmt.Fprintf(w, "%d %s %s", r.ProtoMajor, r.RemoteAddr, r.TLS.PeerCertificates[0].Subject.CommonName)
		case "/gzip":
			if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
				http.Error(w, "no gzip asked for", http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			fmt.Fprintf(zw, "%d %s inflated", r.ProtoMajor, r.RemoteAddr)
			zw.Close()
		case "/close":
			w.Header().Set("Connection", "close")
			fmt.Fprintf(w, "%d %s", r.ProtoMajor, r.RemoteAddr)
		case "/big":
			w.Write(bytes.Repeat([]byte("x"), 1<<20))
		case "/hang":
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			hangEnded <- struct{}{}
		}
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, hangEnded
}

// TestReads: gets go over pooled HTTP/1.1 connections once one is made,
// over HTTP/2 until then, and whatever happens to a pooled connection the
// request is answered.
func TestReads(t *testing.T) {
	srv, hangEnded := readsServer(t)
	u, use := withClientCert(t, srv)
	use("first")
	rt := u.ReadTransport()
	get := func(ctx context.Context, path string) (string, *http.Response, error) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return "", nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), resp, err
	}
	// who returns the protocol's major version, the client's address and
	// the certificate's name.
	who := func(path string) (proto, addr, cn string) {
		t.Helper()
		s, _, err := get(context.Background(), path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		f := strings.Fields(s)
		if len(f) < 2 {
			t.Fatalf("GET %s: %q", path, s)
		}
		f = append(f, "")
		return f[0], f[1], f[2]
	}
	reads := func() *Reads { return u.pools.reads.cur.Load() }
	idle := func() int {
		r := reads()
		r.mu.Lock()
		defer r.mu.Unlock()
		if h := r.hosts[srv.Listener.Addr().String()]; h != nil {
			return len(h.idle)
		}
		return 0
	}
	waitIdle := func(n int) {
		t.Helper()
		testenv.Eventually(t, fmt.Sprintf("%d idle connections", n), func() bool { return idle() == n })
	}

	// The first get goes over HTTP/2 while a connection is made.
	if proto, _, _ := who("/who"); proto != "2" {
		t.Errorf("first get over HTTP/%s, want 2 (no connection of its own yet)", proto)
	}
	waitIdle(1)
	proto, addr, cn := who("/who")
	if proto != "1" || cn != "first" {
		t.Fatalf("second get: HTTP/%s as %q, want HTTP/1 as first", proto, cn)
	}
	if _, again, _ := who("/who"); again != addr {
		t.Errorf("third get from %s, want the pooled connection %s", again, addr)
	}

	t.Run("gzip", func(t *testing.T) {
		body, resp, err := get(context.Background(), "/gzip")
		if err != nil || !strings.HasSuffix(body, "inflated") || !resp.Uncompressed || resp.Header.Get("Content-Encoding") != "" {
			t.Fatalf("gzip: %q, %v (uncompressed %v, encoding %q)", body, err, resp != nil && resp.Uncompressed, resp.Header.Get("Content-Encoding"))
		}
		if f := strings.Fields(body); f[0] != "1" || f[1] != addr {
			t.Errorf("gzip get: %q, want HTTP/1 on %s", body, addr)
		}
		if _, again, _ := who("/who"); again != addr {
			t.Errorf("after a gzip body the connection was not reused: %s, want %s", again, addr)
		}
	})

	t.Run("unread body", func(t *testing.T) {
		req, _ := http.NewRequest("GET", srv.URL+"/big", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil || resp.ProtoMajor != 1 {
			t.Fatalf("GET /big: %v, %v", resp, err)
		}
		resp.Body.Close() // unread: the connection cannot be reused, another is made
		waitIdle(1)
		if proto, a, _ := who("/who"); proto != "1" || a == addr {
			t.Errorf("after a body left unread: HTTP/%s on %s, want a new HTTP/1 connection", proto, a)
		} else {
			addr = a
		}
	})

	t.Run("connection close", func(t *testing.T) {
		if proto, _, _ := who("/close"); proto != "1" {
			t.Fatalf("GET /close over HTTP/%s", proto)
		}
		waitIdle(1)
		if _, a, _ := who("/who"); a == addr {
			t.Errorf("a connection the server closes was pooled")
		} else {
			addr = a
		}
	})

	t.Run("closed while idle", func(t *testing.T) {
		r := reads()
		r.mu.Lock()
		var conns []net.Conn
		for _, rc := range r.hosts[srv.Listener.Addr().String()].idle {
			conns = append(conns, rc.c.(*tls.Conn).NetConn())
		}
		r.mu.Unlock()
		if len(conns) == 0 {
			t.Fatal("no idle connection to close")
		}
		srv.CloseClientConnections()
		for _, c := range conns {
			waitPeerClosed(t, c) // the FIN has arrived
		}
		// The server closed the fallback's HTTP/2 connection too; its
		// client learns that at its own pace (a get sent on it meanwhile
		// fails, which is HTTP/2's business, not this test's): it starts
		// afresh.
		r.fallback.(interface{ CloseIdleConnections() }).CloseIdleConnections()
		proto, _, _ := who("/who")
		if proto != "2" {
			t.Errorf("a get on a connection the server closed: HTTP/%s, want it sent again over HTTP/2", proto)
		}
		waitIdle(1)
		_, addr, _ = who("/who")
	})

	t.Run("dead while idle", func(t *testing.T) {
		// As a connection the kernel ended while idle: the next use
		// fails at once, with no word from the server.
		r := reads()
		r.mu.Lock()
		for _, rc := range r.hosts[srv.Listener.Addr().String()].idle {
			rc.c.(*tls.Conn).NetConn().SetDeadline(time.Unix(1, 0))
		}
		r.mu.Unlock()
		if proto, _, _ := who("/who"); proto != "2" {
			t.Errorf("a get on a dead idle connection: HTTP/%s, want it sent again over HTTP/2", proto)
		}
		waitIdle(1)
		_, addr, _ = who("/who")
	})

	t.Run("context ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/hang", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil || resp.ProtoMajor != 1 {
			t.Fatalf("GET /hang: %v, %v", resp, err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := io.ReadAll(resp.Body)
			done <- err
		}()
		cancel()
		// The read ends with an error, or at the end the server makes
		// once it sees the connection close (a race on loopback).
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("a read went on after the context ended")
		}
		resp.Body.Close()
		select {
		case <-hangEnded:
		case <-time.After(5 * time.Second):
			t.Fatal("the server's request did not end: the connection stayed open")
		}
		waitIdle(1)
		if _, a, _ := who("/who"); a == addr {
			t.Errorf("a connection whose request was cancelled was pooled")
		}
	})

	t.Run("rotate", func(t *testing.T) {
		use("second")
		if _, _, cn := who("/who"); cn != "first" {
			t.Errorf("before Rotate: %q, want the pooled connection's first", cn)
		}
		u.Rotate()
		if idle() != 0 {
			t.Errorf("%d idle connections after Rotate", idle())
		}
		if proto, _, cn := who("/who"); proto != "2" || cn != "second" {
			t.Errorf("right after Rotate: HTTP/%s as %q, want HTTP/2 as second", proto, cn)
		}
		waitIdle(1)
		if proto, _, cn := who("/who"); proto != "1" || cn != "second" {
			t.Errorf("after Rotate: HTTP/%s as %q, want HTTP/1 as second", proto, cn)
		}
	})

	t.Run("idle timeout", func(t *testing.T) {
		r := reads()
		r.mu.Lock()
		r.idleTimeout = 50 * time.Millisecond
		r.mu.Unlock()
		who("/who") // given back with the short timeout
		waitIdle(0)
	})

	t.Run("body refused", func(t *testing.T) {
		req, _ := http.NewRequest("POST", srv.URL+"/who", strings.NewReader("x"))
		if _, err := rt.RoundTrip(req); err == nil {
			t.Error("a request with a body was sent")
		}
	})
}

// TestReadsTune: the connections Reads makes end on a dead path as the
// HTTP/2 pings would: keepalive probes and TCP_USER_TIMEOUT are set.
func TestReadsTune(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := newReads(nil, nil, nil, 2*time.Second, time.Second)
	if err := r.tune(c); err != nil {
		t.Fatal(err)
	}
	opt := func(level, name int) int {
		raw, _ := c.(*net.TCPConn).SyscallConn()
		var v int
		var gerr error
		raw.Control(func(fd uintptr) { v, gerr = syscall.GetsockoptInt(int(fd), level, name) })
		if gerr != nil {
			t.Fatal(gerr)
		}
		return v
	}
	for _, o := range []struct {
		what        string
		level, name int
		want        int
	}{
		{"SO_KEEPALIVE", syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
		{"TCP_KEEPIDLE", syscall.IPPROTO_TCP, unix.TCP_KEEPIDLE, 2},
		{"TCP_KEEPINTVL", syscall.IPPROTO_TCP, unix.TCP_KEEPINTVL, 1},
		{"TCP_USER_TIMEOUT", syscall.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, 3000},
	} {
		if got := opt(o.level, o.name); got != o.want {
			t.Errorf("%s = %d, want %d", o.what, got, o.want)
		}
	}
	// Other connections (a tunnel's, a test's pipe) are left alone.
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if err := r.tune(p1); err != nil {
		t.Errorf("tune of a pipe: %v", err)
	}
	if !closedByPeer(fmt.Errorf("read: %w", syscall.ECONNRESET)) || closedByPeer(fmt.Errorf("read: %w", syscall.ETIMEDOUT)) ||
		closedByPeer(errors.New("other")) {
		t.Error("closedByPeer tells a reset from a timeout wrongly")
	}
}

// waitPeerClosed waits, up to 30 s, until the other end of c has closed
// it: its socket polls POLLRDHUP (the FIN has arrived).
func waitPeerClosed(t *testing.T, c net.Conn) {
	t.Helper()
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var revents int16
	var perr error
	raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
			var n int
			if n, perr = unix.Poll(fds, 1000); n > 0 || (perr != nil && perr != unix.EINTR) {
				revents = fds[0].Revents
				return
			}
		}
	})
	if revents&unix.POLLRDHUP == 0 {
		t.Fatalf("the server's close did not reach the client's connection within 30 s (revents %#x, %v)", revents, perr)
	}
}
