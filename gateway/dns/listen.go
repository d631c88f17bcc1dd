package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sync/errgroup"
)

// tcpIdleTimeout closes a TCP connection that sends no query for this long
// (RFC 7766 suggests seconds).
const tcpIdleTimeout = 10 * time.Second

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

// session is the per-goroutine state of the raw query path: messages and a
// buffer reused from one query to the next.
type session struct {
	req, resp dns.Msg
	opt       dns.OPT
	buf       []byte
}

func newSession() *session { return &session{buf: make([]byte, dns.MaxMsgSize+2)} }

// handle answers the raw query in, from src, and returns the raw
// response, which is valid until the next call, or nil when in gets no
// answer (it does not unpack, or it is a response). Over TCP the response
// starts with its two-byte length.
func (s *Server) handle(ss *session, in []byte, tcp bool, src netip.Addr) []byte {
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
	if tcp {
		limit = dns.MaxMsgSize
		buf = buf[2:]
	}
	out, err := pack(&ss.resp, buf, limit)
	if err != nil {
		s.log.Debug("pack dns response", "name", questionName(&ss.req), "err", err)
		s.metrics.dropped()
		return nil
	}
	s.answered(src, &ss.req, ss.resp.Rcode)
	if tcp {
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
// connection and returns nil. It returns an error if a socket fails.
func (s *Server) Serve(ctx context.Context, pc net.PacketConn, ln net.Listener) error {
	g, gctx := errgroup.WithContext(ctx)
	var conns sync.WaitGroup
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
		for range max(2, runtime.GOMAXPROCS(0)) {
			g.Go(func() error { return s.serveUDP(gctx, pc) })
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

func (s *Server) serveUDP(ctx context.Context, pc net.PacketConn) error {
	ss := newSession()
	in := make([]byte, dns.MaxMsgSize)
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
			if goOn, err := loopError(ctx, err, "read dns query"); !goOn {
				return err
			}
			continue
		}
		src := ap.Addr()
		if uc == nil {
			src = addrOf(from)
		}
		out := s.handle(ss, in[:n], false, src)
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

func (s *Server) serveTCP(ctx context.Context, ln net.Listener, conns *sync.WaitGroup) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if goOn, err := loopError(ctx, err, "accept dns connection"); !goOn {
				return err
			}
			continue
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			defer c.Close()
			s.serveConn(c)
		}()
	}
}

// loopError tells a serving loop what a read or accept error means: go on
// after a timeout, stop quietly once ctx is done, stop with the error
// otherwise.
func loopError(ctx context.Context, err error, doing string) (goOn bool, _ error) {
	if ctx.Err() != nil {
		return false, nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true, nil
	}
	return false, fmt.Errorf("%s: %w", doing, err)
}

// serveConn answers the queries of one TCP connection in order until the
// client closes it, stays idle too long or sends garbage.
func (s *Server) serveConn(c net.Conn) {
	ss := newSession()
	in := make([]byte, dns.MaxMsgSize)
	src := addrOf(c.RemoteAddr())
	for {
		c.SetReadDeadline(time.Now().Add(tcpIdleTimeout))
		if _, err := io.ReadFull(c, in[:2]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(in[:2]))
		if _, err := io.ReadFull(c, in[:n]); err != nil {
			return
		}
		out := s.handle(ss, in[:n], true, src)
		if out == nil {
			return
		}
		c.SetWriteDeadline(time.Now().Add(tcpIdleTimeout))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}
