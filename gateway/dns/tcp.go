package dns

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Defaults for the TCP limits in Options. DNS over TCP is the fallback for
// answers that do not fit in UDP (RFC 7766); resolvers open a few
// connections each and reuse them, so these leave room for hundreds of
// resolvers while bounding what a flood of connections costs: an idle
// connection holds its socket and a goroutine, one in the middle of a
// query a pooled 128 KiB session, so at most 32 MiB of sessions with the
// default cap.
const (
	DefaultMaxTCPConns          = 256
	DefaultMaxTCPConnsPerSource = 32
	DefaultTCPIdleTimeout       = 10 * time.Second // RFC 7766 suggests seconds
)

// Reasons a TCP connection is refused
// (tether_gateway_dns_tcp_refusals_total{reason}).
const (
	ReasonMaxConns          = "max_connections"            // MaxTCPConns are open
	ReasonMaxConnsPerSource = "max_connections_per_source" // MaxTCPConnsPerSource are open from its address
)

// tcpSessions holds the sessions of TCP queries being answered: a
// connection takes one after a query's length arrives and puts it back
// after the answer is written, so an idle connection holds none.
var tcpSessions = sync.Pool{New: func() any { return newSession() }}

// tcpConns counts the open TCP connections, overall and per source
// address, against the limits.
type tcpConns struct {
	max, perSource int

	mu       sync.Mutex
	open     int
	bySource map[netip.Addr]int // no entry at 0, so at most max entries
}

func newTCPConns(max, perSource int) *tcpConns {
	return &tcpConns{max: max, perSource: perSource, bySource: map[netip.Addr]int{}}
}

// acquire counts a connection from src, or returns why it may not be
// opened.
func (t *tcpConns) acquire(src netip.Addr) (refusal string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.open >= t.max:
		return ReasonMaxConns
	case t.bySource[src] >= t.perSource:
		return ReasonMaxConnsPerSource
	}
	t.open++
	t.bySource[src]++
	return ""
}

// release uncounts a connection acquire counted.
func (t *tcpConns) release(src netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.open--
	if t.bySource[src]--; t.bySource[src] <= 0 {
		delete(t.bySource, src)
	}
}

// serveTCP accepts connections on ln, which fails only once closed
// (accept.Listen), and serves each in its own goroutine within the
// connection limits.
func (s *Server) serveTCP(ctx context.Context, ln net.Listener, conns *sync.WaitGroup) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept dns connection: %w", err)
		}
		src := addrOf(c.RemoteAddr())
		if reason := s.tcp.acquire(src); reason != "" {
			s.refuseConn(c, src, reason)
			continue
		}
		s.metrics.tcpOpened()
		conns.Add(1)
		go func() {
			defer conns.Done()
			defer s.metrics.tcpClosed()
			defer s.tcp.release(src)
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			defer c.Close()
			s.serveConn(c, src)
		}()
	}
}

// refuseConn resets c, a connection past a limit, and counts and logs it.
func (s *Server) refuseConn(c net.Conn, src netip.Addr, reason string) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0) // a reset: the client moves on at once, and no TIME_WAIT stays here
	}
	// Counted before the reset, so that the count is in place when the
	// client sees it.
	s.metrics.tcpRefused(reason)
	s.connRefusals.refusedConn(src, reason)
	c.Close()
}

// serveConn answers the queries of one TCP connection in order until the
// client closes it, sends garbage, or sends no complete query within the
// idle timeout of connecting or of the previous answer. It reads one
// query's bytes at a time: never more than its two-byte length says, at
// most 64 KiB.
func (s *Server) serveConn(c net.Conn, src netip.Addr) {
	var length [2]byte
	for {
		c.SetReadDeadline(time.Now().Add(s.opts.TCPIdleTimeout))
		if _, err := io.ReadFull(c, length[:]); err != nil {
			return
		}
		ss := tcpSessions.Get().(*session)
		ok := s.answerConn(c, ss, int(binary.BigEndian.Uint16(length[:])), src)
		tcpSessions.Put(ss)
		if !ok {
			return
		}
	}
}

// answerConn reads a query of n bytes from c and writes its answer; false
// ends the connection.
func (s *Server) answerConn(c net.Conn, ss *session, n int, src netip.Addr) bool {
	in := ss.in[:n]
	if _, err := io.ReadFull(c, in); err != nil {
		return false
	}
	out := s.handle(ss, in, overTCP, src)
	if out == nil {
		return false
	}
	c.SetWriteDeadline(time.Now().Add(s.opts.TCPIdleTimeout))
	_, err := c.Write(out)
	return err == nil
}
