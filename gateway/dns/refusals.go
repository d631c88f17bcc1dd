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
type refusalLog struct {
	log   *slog.Logger
	clock clock.PassiveClock
	every time.Duration

	mu      sync.Mutex
	sources map[netip.Addr]*refusalSource // the zero Addr is "other"
}

type refusalSource struct {
	next       time.Time // when the next line may be logged
	suppressed int       // refusals not logged since the last line
}

func newRefusalLog(log *slog.Logger, clk clock.PassiveClock, every time.Duration) *refusalLog {
	return &refusalLog{log: log, clock: clk, every: every, sources: map[netip.Addr]*refusalSource{}}
}

// refused records that req, from src (the zero Addr if unknown), was
// answered REFUSED, and logs it unless src had a line logged less than an
// interval ago.
func (l *refusalLog) refused(src netip.Addr, req *dns.Msg) {
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
	l.log.Info("dns query refused", refusalAttrs(src, req, e.suppressed)...)
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
			l.log.Info("dns queries refused", "source", sourceString(src), "suppressed", e.suppressed)
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
