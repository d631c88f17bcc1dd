package upstream

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Reads sends requests that end (get and list, never watches) on HTTP/1.1
// connections of their own, driven by the caller's goroutine: the request
// is written and the answer read by the goroutine that asked, with no
// hand-over to a connection's reader and writer goroutines as net/http's
// transports make. On a 2-core edge node that hand-over is a good part of
// what a proxied GET costs (edgeproxy/apiproxy/README.md, Benchmark).
//
// A request never waits for a connection to be made: when no idle
// connection to its server is at hand it goes over the fallback transport
// (the HTTP/2 one, warm already), and one connection is dialled in the
// background for the next request. A reused connection that fails before
// any answer (the server closed it while idle) has the request sent again
// over the fallback: these requests have no body and are safe to repeat.
//
// Dead paths are noticed as with HTTP/2 pings: TCP keepalive probes after
// pingAfter of silence and TCP_USER_TIMEOUT of pingAfter+pingTimeout make
// the kernel end a connection whose data or probes go unacknowledged.
type Reads struct {
	tls         *tls.Config
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	fallback    http.RoundTripper
	pingAfter   time.Duration
	pingTimeout time.Duration
	idleTimeout time.Duration
	maxIdle     int

	mu      sync.Mutex
	closed  bool
	hosts   map[string]*readHost
	dialCtx context.Context
	stop    context.CancelFunc
}

type readHost struct {
	idle    []*readConn // most recently used last
	dialing bool
}

type readConn struct {
	host string
	c    net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	idle *time.Timer // closes the connection after idleTimeout unused
}

const (
	// readsMaxIdle is how many idle connections per server are kept.
	readsMaxIdle = 4
	// readsIdleTimeout is how long an idle connection is kept.
	readsIdleTimeout = 30 * time.Second
)

func newReads(tlsConf *tls.Config, dial func(ctx context.Context, network, addr string) (net.Conn, error),
	fallback http.RoundTripper, pingAfter, pingTimeout time.Duration) *Reads {
	conf := &tls.Config{}
	if tlsConf != nil {
		conf = tlsConf.Clone()
	}
	conf.NextProtos = []string{"http/1.1"}
	ctx, stop := context.WithCancel(context.Background())
	return &Reads{tls: conf, dial: dial, fallback: fallback, pingAfter: pingAfter, pingTimeout: pingTimeout,
		idleTimeout: readsIdleTimeout, maxIdle: readsMaxIdle, hosts: map[string]*readHost{}, dialCtx: ctx, stop: stop}
}

// RoundTrip sends r, a request without a body.
func (t *Reads) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil && r.Body != http.NoBody {
		return nil, errors.New("upstream reads: a request with a body")
	}
	if r.URL.Scheme != "https" {
		return t.fallback.RoundTrip(r)
	}
	rc := t.take(r.URL.Host)
	if rc == nil {
		return t.fallback.RoundTrip(r)
	}
	start := time.Now()
	resp, err := t.send(rc, r)
	if err != nil && r.Context().Err() == nil && (closedByPeer(err) || time.Since(start) < staleWithin) {
		// The idle connection was gone already: the server closed it,
		// or the kernel ended it while idle (keepalive probes went
		// unanswered during a cut). The request goes again, over the
		// transport that never makes it wait. A path that died under
		// this request (a timeout after staleWithin) is not tried again.
		return t.fallback.RoundTrip(r)
	}
	return resp, err
}

// staleWithin: a request that fails sooner than this on an idle
// connection found the connection dead, not the path.
const staleWithin = time.Second

// closedByPeer reports whether err says the other end closed the
// connection.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// send writes r on rc and reads the answer's header.
func (t *Reads) send(rc *readConn, r *http.Request) (*http.Response, error) {
	ctx := r.Context()
	// Until the answer is read whole, an ended context closes the
	// connection, which ends any read or write on it.
	stop := context.AfterFunc(ctx, func() { rc.c.Close() })
	gzipped := false
	if r.Header.Get("Accept-Encoding") == "" && r.Header.Get("Range") == "" && r.Method != http.MethodHead {
		// As net/http's transports: ask for gzip, hand over the inflated
		// body.
		r = r.Clone(ctx)
		r.Header.Set("Accept-Encoding", "gzip")
		gzipped = true
	}
	fail := func(err error) (*http.Response, error) {
		stop()
		t.lost(rc)
		return nil, err
	}
	if err := r.Write(rc.bw); err != nil {
		return fail(err)
	}
	if err := rc.bw.Flush(); err != nil {
		return fail(err)
	}
	resp, err := http.ReadResponse(rc.br, r)
	if err != nil {
		return fail(err)
	}
	body := &readBody{r: resp.Body, t: t, rc: rc, stop: stop, keep: !resp.Close}
	resp.Body = body
	if gzipped && strings.EqualFold(resp.Header.Get("Content-Encoding"), "gzip") {
		resp.Body = &gunzipBody{body: body}
		resp.Header.Del("Content-Encoding")
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
		resp.Uncompressed = true
	}
	return resp, nil
}

// readBody is an answer's body; read to its end and closed, it gives its
// connection back to the pool.
type readBody struct {
	r    io.ReadCloser
	t    *Reads
	rc   *readConn
	stop func() bool
	keep bool // the server did not say it closes the connection
	eof  bool
	once sync.Once
}

func (b *readBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}

func (b *readBody) Close() error {
	b.once.Do(func() {
		if b.stop() && b.eof && b.keep {
			b.t.put(b.rc)
			return
		}
		b.t.lost(b.rc) // the context ended, the rest of the body is unread, or the server closes it
	})
	return nil
}

// gunzipBody inflates a gzip body on its first read.
type gunzipBody struct {
	body *readBody
	zr   *gzip.Reader
	err  error
}

func (g *gunzipBody) Read(p []byte) (int, error) {
	if g.zr == nil && g.err == nil {
		g.zr, g.err = gzip.NewReader(g.body)
	}
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.zr.Read(p)
	if errors.Is(err, io.EOF) {
		// Read the stream's end, so that the connection can be reused.
		io.Copy(io.Discard, g.body)
	}
	return n, err
}

func (g *gunzipBody) Close() error { return g.body.Close() }

// take returns an idle connection to host, or nil after starting to dial
// one for the next request.
func (t *Reads) take(host string) *readConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	h := t.hosts[host]
	if h == nil {
		h = &readHost{}
		t.hosts[host] = h
	}
	for n := len(h.idle); n > 0; n = len(h.idle) {
		rc := h.idle[n-1]
		h.idle = h.idle[:n-1]
		if rc.idle.Stop() {
			return rc
		}
		// Its idle timer fired at the same moment and closes it.
	}
	t.dialLocked(host)
	return nil
}

// dialLocked starts dialling a connection to host unless one is being
// dialled already; t.mu is held.
func (t *Reads) dialLocked(host string) {
	if h := t.hosts[host]; h != nil && !h.dialing && !t.closed {
		h.dialing = true
		go t.connect(host)
	}
}

// lost closes a connection that cannot serve again, and has another
// one dialled for the requests to come.
func (t *Reads) lost(rc *readConn) {
	rc.c.Close()
	t.mu.Lock()
	t.dialLocked(rc.host)
	t.mu.Unlock()
}

// put gives a connection back, or closes it if enough are idle.
func (t *Reads) put(rc *readConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.hosts[rc.host]
	if t.closed || h == nil || len(h.idle) >= t.maxIdle {
		rc.c.Close()
		return
	}
	h.idle = append(h.idle, rc)
	t.idleTimer(rc)
}

// idleTimer arms rc's timer: unused for idleTimeout, it is closed.
func (t *Reads) idleTimer(rc *readConn) {
	if rc.idle == nil {
		rc.idle = time.AfterFunc(t.idleTimeout, func() { t.expire(rc) })
		return
	}
	rc.idle.Reset(t.idleTimeout)
}

func (t *Reads) expire(rc *readConn) {
	t.mu.Lock()
	if h := t.hosts[rc.host]; h != nil {
		for i, c := range h.idle {
			if c == rc {
				h.idle = append(h.idle[:i], h.idle[i+1:]...)
				break
			}
		}
	}
	t.mu.Unlock()
	rc.c.Close()
}

// connect dials and shakes hands with host, and pools the connection.
func (t *Reads) connect(host string) {
	rc, err := t.open(host)
	t.mu.Lock()
	if h := t.hosts[host]; h != nil {
		h.dialing = false
	}
	t.mu.Unlock()
	if err == nil {
		t.put(rc)
	}
	// A failed dial is not reported: requests go over the fallback, whose
	// errors are, and the next one dials again.
}

func (t *Reads) open(host string) (*readConn, error) {
	ctx, cancel := context.WithTimeout(t.dialCtx, 10*time.Second)
	defer cancel()
	raw, err := t.dial(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	if err := t.tune(raw); err != nil {
		raw.Close()
		return nil, err
	}
	conf := t.tls
	if conf.ServerName == "" {
		conf = conf.Clone()
		conf.ServerName, _, _ = net.SplitHostPort(host)
	}
	c := tls.Client(raw, conf)
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	if p := c.ConnectionState().NegotiatedProtocol; p != "" && p != "http/1.1" {
		c.Close()
		return nil, fmt.Errorf("%s negotiated %q, not http/1.1", host, p)
	}
	return &readConn{host: host, c: c, br: bufio.NewReaderSize(c, 16<<10), bw: bufio.NewWriterSize(c, 4<<10)}, nil
}

// tune sets keepalive probes and TCP_USER_TIMEOUT on a TCP connection, so
// that a dead path ends it in about pingAfter+pingTimeout. Connections
// of other kinds are left as they are.
func (t *Reads) tune(c net.Conn) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	if err := tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: t.pingAfter, Interval: t.pingTimeout, Count: 1}); err != nil {
		return fmt.Errorf("keepalive: %w", err)
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int((t.pingAfter + t.pingTimeout).Milliseconds()))
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("TCP_USER_TIMEOUT: %w", err)
	}
	return nil
}

// CloseIdleConnections closes the idle connections; requests after it
// dial new ones.
func (t *Reads) CloseIdleConnections() {
	t.mu.Lock()
	var idle []*readConn
	for _, h := range t.hosts {
		idle = append(idle, h.idle...)
		h.idle = nil
	}
	t.mu.Unlock()
	for _, rc := range idle {
		rc.idle.Stop()
		rc.c.Close()
	}
}

// close closes the idle connections and stops pooling: connections in use
// close when their answer is read.
func (t *Reads) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.stop()
	t.CloseIdleConnections()
}
