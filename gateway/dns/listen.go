package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"syscall"

	"github.com/miekg/dns"
	"golang.org/x/sync/errgroup"

	"github.com/tether-edge/tether/internal/accept"
)

// udpReadBuffer is the UDP receive buffer Serve asks for: room for
// thousands of queued queries, so that bursts are not dropped.
const udpReadBuffer = 4 << 20

// ServeDNS answers one query; it makes Server a dns.Handler for use with
// dns.Server. Serve and ListenAndServe do not go through it.
func (s *Server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	var resp dns.Msg
	var opt dns.OPT
	ok, limit := s.respond(r, &resp, &opt)
	if !ok {
		s.metrics.dropped()
		return
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); !udp {
		limit = dns.MaxMsgSize
	} else {
		limit = min(limit, s.opts.MaxAmplification*r.Len())
	}
	out, err := pack(&resp, nil, limit)
	if err != nil {
		s.log.Debug("pack dns response", "name", questionName(r), "err", err)
		s.metrics.dropped()
		return
	}
	s.answered(addrOf(w.RemoteAddr()), r, resp.Rcode)
	_, _ = w.Write(out)
}

// session is the state of the raw query path: messages and buffers reused
// from one query to the next, the largest message in and the largest
// answer out. Each UDP reader keeps one; TCP connections share a pool.
type session struct {
	req, resp dns.Msg
	opt       dns.OPT
	in        []byte
	buf       []byte
}

func newSession() *session {
	return &session{in: make([]byte, dns.MaxMsgSize), buf: make([]byte, dns.MaxMsgSize+2)}
}

// transport is how a query came, which decides the size and the framing
// of its answer.
type transport uint8

const (
	overUDP transport = iota // one datagram, within the size the query offers (512 bytes without EDNS0)
	overTCP                  // a stream: up to 64 KiB, after the message's two-byte length
)

func (t transport) String() string {
	if t == overTCP {
		return "tcp"
	}
	return "udp"
}

// handle answers the raw query in, which came from src over via, and
// returns the raw response, which is valid until the next call, or nil
// when in gets no answer (it does not unpack, or it is a response). Over
// TCP the response starts with its two-byte length.
func (s *Server) handle(ss *session, in []byte, via transport, src netip.Addr) []byte {
	if err := ss.req.Unpack(in); err != nil {
		s.metrics.dropped()
		return nil
	}
	ok, limit := s.respond(&ss.req, &ss.resp, &ss.opt)
	if !ok {
		s.metrics.dropped()
		return nil
	}
	buf := ss.buf[:cap(ss.buf)]
	if via == overTCP {
		limit = dns.MaxMsgSize
		buf = buf[2:]
	} else {
		limit = min(limit, s.opts.MaxAmplification*len(in))
	}
	out, err := pack(&ss.resp, buf, limit)
	if err != nil {
		s.log.Debug("pack dns response", "name", questionName(&ss.req), "err", err)
		s.metrics.dropped()
		return nil
	}
	s.answered(src, &ss.req, ss.resp.Rcode)
	if via == overTCP {
		out = ss.buf[:len(out)+2]
		binary.BigEndian.PutUint16(out, uint16(len(out)-2))
	}
	return out
}

// answered counts an answer with rcode to req from src, and logs it if it
// is a refusal.
func (s *Server) answered(src netip.Addr, req *dns.Msg, rcode int) {
	s.metrics.answered(rcode)
	if rcode == dns.RcodeRefused {
		s.refusals.refused(src, req)
	}
}

func questionName(m *dns.Msg) string {
	if len(m.Question) == 0 {
		return ""
	}
	return m.Question[0].Name
}

// ListenAndServe serves UDP and TCP on addr (host:port; port 0 picks one
// port free for both) until ctx is done, then returns nil.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	pc, ln, err := Listen(ctx, addr)
	if err != nil {
		return err
	}
	s.log.Info("serving dns", "addr", pc.LocalAddr().String(), "zones", s.opts.Zones, "mode", s.opts.Mode)
	return s.Serve(ctx, pc, ln)
}

// Listen binds UDP and TCP on addr (host:port; port 0 picks one port free
// for both), for Serve.
func Listen(ctx context.Context, addr string) (net.PacketConn, net.Listener, error) {
	host, port, _ := net.SplitHostPort(addr)
	// With port 0 the TCP listener takes the port the kernel gave UDP,
	// which TCP may already use: try another one a few times.
	attempts := 1
	if port == "0" {
		attempts = 8
	}
	var err error
	for range attempts {
		var pc net.PacketConn
		var ln net.Listener
		if pc, ln, err = listenBoth(ctx, addr, host, port == "0"); err == nil {
			return pc, ln, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, nil, err
}

// listenBoth opens UDP on addr and TCP on the same port (the UDP socket's,
// when samePort).
func listenBoth(ctx context.Context, addr, host string, samePort bool) (net.PacketConn, net.Listener, error) {
	var lc net.ListenConfig
	pc, err := lc.ListenPacket(ctx, "udp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen for dns on udp %s: %w", addr, err)
	}
	tcpAddr := addr
	if samePort {
		tcpAddr = net.JoinHostPort(host, fmt.Sprint(pc.LocalAddr().(*net.UDPAddr).Port))
	}
	ln, err := lc.Listen(ctx, "tcp", tcpAddr)
	if err != nil {
		pc.Close()
		return nil, nil, fmt.Errorf("listen for dns on tcp %s: %w", tcpAddr, err)
	}
	return pc, ln, nil
}

// Serve answers queries arriving on pc (UDP) and ln (TCP), either of which
// may be nil, until ctx is done; it then closes them and every TCP
// connection and returns nil. A failed accept or read is retried after a
// backoff (internal/accept) and counted, never returned: Serve returns an
// error only if a socket is closed under it before ctx is done.
func (s *Server) Serve(ctx context.Context, pc net.PacketConn, ln net.Listener) error {
	g, gctx := errgroup.WithContext(ctx)
	var conns sync.WaitGroup
	if ln != nil {
		ln = accept.Listen(ln, accept.Options{Name: listenerTCP, Logger: s.log, Errors: s.metrics.acceptErrors(listenerTCP)})
	}
	g.Go(func() error {
		<-gctx.Done()
		if pc != nil {
			pc.Close()
		}
		if ln != nil {
			ln.Close()
		}
		return nil
	})
	if uc, ok := pc.(*net.UDPConn); ok {
		if err := growReadBuffer(uc, udpReadBuffer); err != nil {
			s.log.Debug("grow dns udp read buffer", "err", err)
		}
	}
	if pc != nil {
		backoff := accept.NewBackoff(accept.Options{Name: listenerUDP, Logger: s.log, Errors: s.metrics.acceptErrors(listenerUDP)})
		for range max(2, runtime.GOMAXPROCS(0)) {
			g.Go(func() error { return s.serveUDP(gctx, pc, backoff) })
		}
	}
	if ln != nil {
		g.Go(func() error { return s.serveTCP(gctx, ln, &conns) })
	}
	err := g.Wait()
	conns.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// serveUDP reads and answers queries on pc until ctx is done; the readers
// of one socket share backoff.
func (s *Server) serveUDP(ctx context.Context, pc net.PacketConn, backoff *accept.Backoff) error {
	ss := newSession()
	in := ss.in
	uc, _ := pc.(*net.UDPConn)
	for {
		var (
			n    int
			from net.Addr
			ap   netip.AddrPort
			err  error
		)
		if uc != nil {
			n, ap, err = uc.ReadFromUDPAddrPort(in) // no allocation per packet
		} else {
			n, from, err = pc.ReadFrom(in)
		}
		if err != nil {
			if goOn, err := readError(ctx, err, backoff); !goOn {
				return err
			}
			continue
		}
		backoff.Succeeded()
		src := ap.Addr()
		if uc == nil {
			src = addrOf(from)
		}
		out := s.handle(ss, in[:n], overUDP, src)
		if out == nil {
			continue
		}
		if uc != nil {
			_, err = uc.WriteToUDPAddrPort(out, ap)
		} else {
			_, err = pc.WriteTo(out, from)
		}
		if err != nil && ctx.Err() == nil {
			s.log.Debug("write dns response", "err", err)
		}
	}
}

// readError tells a UDP reader what a read error means: stop quietly once
// ctx is done, stop with the error if the socket was closed under it, go
// on at once after a timeout, and after a backoff otherwise.
func readError(ctx context.Context, err error, backoff *accept.Backoff) (goOn bool, _ error) {
	if ctx.Err() != nil {
		return false, nil
	}
	if errors.Is(err, net.ErrClosed) {
		return false, fmt.Errorf("read dns query: %w", err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true, nil
	}
	return backoff.Wait(ctx.Done(), err), nil
}
