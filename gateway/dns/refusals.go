package dns

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
	"k8s.io/utils/clock"
)

const (
	// DefaultRefusalLogInterval is how often, at most, a refused query is
	// logged per source address.
	DefaultRefusalLogInterval = time.Minute
	// maxRefusalSources bounds the sources remembered between log lines.
	// Past it (a flood from spoofed addresses, say), refusals from new
	// sources are logged together, once per interval, as source "other".
	maxRefusalSources = 4096
)

// refusalLog logs refused queries so that an operator sees who asks the
// gateway for names it does not serve (a client using it as a general
// resolver, a zone transfer): at most one line per source address per
// interval, each counting the refusals of that source left unlogged since
// its previous line. Only refusals take its lock; answers never do.
//
// The server keeps two: one for queries answered REFUSED, one for TCP
// connections refused past the connection limits.
type refusalLog struct {
	log   *slog.Logger
	clock clock.PassiveClock
	every time.Duration
	// line starts a source's line; sweepLine its last one, with only the
	// count of unlogged refusals.
	line, sweepLine string

	mu      sync.Mutex
	sources map[netip.Addr]*refusalSource // the zero Addr is "other"
}

type refusalSource struct {
	next       time.Time // when the next line may be logged
	suppressed int       // refusals not logged since the last line
}

// newRefusalLog returns the log of refused queries.
func newRefusalLog(log *slog.Logger, clk clock.PassiveClock, every time.Duration) *refusalLog {
	return &refusalLog{log: log, clock: clk, every: every, line: "dns query refused", sweepLine: "dns queries refused",
		sources: map[netip.Addr]*refusalSource{}}
}

// newConnRefusalLog returns the log of refused TCP connections.
func newConnRefusalLog(log *slog.Logger, clk clock.PassiveClock, every time.Duration) *refusalLog {
	l := newRefusalLog(log, clk, every)
	l.line, l.sweepLine = "dns tcp connection refused", "dns tcp connections refused"
	return l
}

// refused records that req, from src (the zero Addr if unknown), was
// answered REFUSED, and logs it unless src had a line logged less than an
// interval ago.
func (l *refusalLog) refused(src netip.Addr, req *dns.Msg) {
	l.note(src, func(src netip.Addr, suppressed int) []any { return refusalAttrs(src, req, suppressed) })
}

// refusedConn records that a TCP connection from src was refused for
// reason, and logs it unless src had a line logged less than an interval
// ago.
func (l *refusalLog) refusedConn(src netip.Addr, reason string) {
	l.note(src, func(src netip.Addr, suppressed int) []any {
		return []any{"source", sourceString(src), "reason", reason, "suppressed", suppressed}
	})
}

// note records a refusal from src and logs it with attrs unless src had a
// line logged less than an interval ago.
func (l *refusalLog) note(src netip.Addr, attrs func(src netip.Addr, suppressed int) []any) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	src = src.Unmap()
	e := l.sources[src]
	if e == nil && len(l.sources) >= maxRefusalSources {
		l.sweep(now)
		if len(l.sources) >= maxRefusalSources {
			src = netip.Addr{}
			e = l.sources[src]
		}
	}
	if e == nil {
		e = &refusalSource{}
		l.sources[src] = e
	} else if now.Before(e.next) {
		e.suppressed++
		return
	}
	l.log.Info(l.line, attrs(src, e.suppressed)...)
	e.next, e.suppressed = now.Add(l.every), 0
}

// sweep forgets the sources whose interval has passed, logging the count
// of those with refusals left unlogged.
func (l *refusalLog) sweep(now time.Time) {
	for src, e := range l.sources {
		if now.Before(e.next) {
			continue
		}
		if e.suppressed > 0 {
			l.log.Info(l.sweepLine, "source", sourceString(src), "suppressed", e.suppressed)
		}
		delete(l.sources, src)
	}
}

func refusalAttrs(src netip.Addr, req *dns.Msg, suppressed int) []any {
	attrs := []any{"source", sourceString(src)}
	if len(req.Question) > 0 {
		q := req.Question[0]
		attrs = append(attrs, "name", q.Name, "qtype", dns.Type(q.Qtype).String(), "reason", refusalReason(q))
	}
	return append(attrs, "rd", req.RecursionDesired, "suppressed", suppressed)
}

// refusalReason says why respond refused q.
func refusalReason(q dns.Question) string {
	switch {
	case q.Qclass != dns.ClassINET:
		return "class " + dns.Class(q.Qclass).String()
	case q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR:
		return "zone transfer"
	}
	return "not a node name nor in a zone of ours"
}

func sourceString(src netip.Addr) string {
	if !src.IsValid() {
		return "other"
	}
	return src.String()
}

// addrOf returns the IP address of a UDP or TCP address, or the zero Addr.
func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
