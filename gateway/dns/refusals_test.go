package dns

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"
	clocktesting "k8s.io/utils/clock/testing"
)

// logRecorder is a slog.Handler that keeps every record's message and
// attributes, rendered as "msg k=v k=v" in the order logged.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *logRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler           { return r }
func (r *logRecorder) WithGroup(string) slog.Handler                { return r }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, b.String())
	return nil
}

// take returns the lines logged since the last take.
func (r *logRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	lines := r.lines
	r.lines = nil
	return lines
}

func TestRefusalLog(t *testing.T) {
	logs := &logRecorder{}
	clk := clocktesting.NewFakePassiveClock(time.Now())
	s := newTestServer(t, Options{Logger: slog.New(logs), Clock: clk})
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::2")
	ask := func(src netip.Addr, m *dns.Msg, via transport, want int) {
		t.Helper()
		raw, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		out := s.handle(newSession(), raw, via, src)
		if via == overTCP {
			out = out[2:]
		}
		r := new(dns.Msg)
		if err := r.Unpack(out); err != nil {
			t.Fatal(err)
		}
		if r.Rcode != want {
			t.Fatalf("%v from %v: rcode %s, want %s", m.Question, src, dns.RcodeToString[r.Rcode], dns.RcodeToString[want])
		}
	}
	expect := func(what string, want ...string) {
		t.Helper()
		if diff := cmp.Diff(want, logs.take()); diff != "" {
			t.Errorf("%s: logged (-want +got):\n%s", what, diff)
		}
	}

	// Answers are not logged, nor are names of ours that do not exist.
	ask(a, query("edge-1.", dns.TypeA, 0), overUDP, dns.RcodeSuccess)
	ask(a, query("nope.tether.internal.", dns.TypeA, 0), overUDP, dns.RcodeNameError)
	expect("answers")

	// A refusal is logged at once, the next ones from the same source
	// within the interval are counted; another source gets its own line.
	ask(a, query("example.com.", dns.TypeA, 0), overUDP, dns.RcodeRefused)
	ask(a, query("example.org.", dns.TypeMX, 0), overTCP, dns.RcodeRefused)
	ask(netip.MustParseAddr("::ffff:192.0.2.1"), query("example.net.", dns.TypeA, 0), overUDP, dns.RcodeRefused)
	axfr := query("tether.internal.", dns.TypeAXFR, 0)
	axfr.RecursionDesired = false
	ask(b, axfr, overTCP, dns.RcodeRefused)
	expect("first refusals",
		"dns query refused source=192.0.2.1 name=example.com. qtype=A reason=not a node name nor in a zone of ours rd=true suppressed=0",
		"dns query refused source=2001:db8::2 name=tether.internal. qtype=AXFR reason=zone transfer rd=false suppressed=0",
	)

	// After the interval, the next refusal is logged with the count of
	// those that were not.
	clk.SetTime(clk.Now().Add(DefaultRefusalLogInterval - time.Second))
	ask(a, query("example.com.", dns.TypeA, 0), overUDP, dns.RcodeRefused)
	expect("within the interval")
	clk.SetTime(clk.Now().Add(time.Second))
	chaos := query("version.bind.", dns.TypeTXT, 0)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	ask(a, chaos, overUDP, dns.RcodeRefused)
	ask(b, query("example.com.", dns.TypeAAAA, 0), overUDP, dns.RcodeRefused)
	expect("after the interval",
		"dns query refused source=192.0.2.1 name=version.bind. qtype=TXT reason=class CH rd=true suppressed=3",
		"dns query refused source=2001:db8::2 name=example.com. qtype=AAAA reason=not a node name nor in a zone of ours rd=true suppressed=0",
	)

	// The handler path knows the client's address too.
	w := &recorder{}
	s.ServeDNS(w, query("example.com.", dns.TypeA, 0))
	expect("ServeDNS",
		"dns query refused source=127.0.0.1 name=example.com. qtype=A reason=not a node name nor in a zone of ours rd=true suppressed=0")
}

// TestRefusalLogManySources checks that the sources remembered stay
// bounded: past the bound, new sources share one line as "other", and once
// the interval has passed the old ones are forgotten, their unlogged
// refusals counted in one last line each.
func TestRefusalLogManySources(t *testing.T) {
	logs := &logRecorder{}
	clk := clocktesting.NewFakePassiveClock(time.Now())
	l := newRefusalLog(slog.New(logs), clk, time.Minute)
	req := query("example.com.", dns.TypeA, 0)
	src := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}) }
	for i := range maxRefusalSources {
		l.refused(src(i), req)
	}
	l.refused(src(0), req) // suppressed
	if got := len(logs.take()); got != maxRefusalSources {
		t.Fatalf("%d lines for %d sources, want one each", got, maxRefusalSources)
	}
	for i := range 3 {
		l.refused(src(maxRefusalSources+i), req)
	}
	lines := logs.take()
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "dns query refused source=other ") {
		t.Fatalf("three new sources past the bound logged %q, want one line for source=other", lines)
	}

	clk.SetTime(clk.Now().Add(time.Minute))
	l.refused(netip.MustParseAddr("10.1.0.1"), req)
	lines = logs.take()
	want := []string{
		"dns queries refused source=10.0.0.0 suppressed=1",
		"dns queries refused source=other suppressed=2",
		"dns query refused source=10.1.0.1 name=example.com. qtype=A reason=not a node name nor in a zone of ours rd=true suppressed=0",
	}
	slices.Sort(lines[:2]) // the sweep goes in map order
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("after the interval (-want +got):\n%s", diff)
	}
	if n := len(l.sources); n != 1 {
		t.Errorf("%d sources remembered after the sweep, want 1", n)
	}
}

// TestRefusalLogSockets checks that the UDP and TCP loops log the
// client's own address.
func TestRefusalLogSockets(t *testing.T) {
	logs := &logRecorder{}
	s := newTestServer(t, Options{Logger: slog.New(logs)})
	pc, ln, err := Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, pc, ln) }()
	defer func() { cancel(); <-done }()

	for _, network := range []string{"udp", "tcp"} {
		// Each from its own loopback address: one line per source.
		local := map[string]net.Addr{
			"udp": &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)},
			"tcp": &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3)},
		}[network]
		c := &dns.Client{Net: network, Timeout: 5 * time.Second, Dialer: &net.Dialer{LocalAddr: local}}
		r, _, err := c.Exchange(query("example.com.", dns.TypeA, 0), pc.LocalAddr().String())
		if err != nil {
			t.Fatalf("%s: %v", network, err)
		}
		if r.Rcode != dns.RcodeRefused {
			t.Errorf("%s: rcode %s, want REFUSED", network, dns.RcodeToString[r.Rcode])
		}
	}
	lines := logs.take()
	var refused []string
	for _, l := range lines {
		if strings.HasPrefix(l, "dns query refused") {
			refused = append(refused, strings.Fields(l)[3])
		}
	}
	if diff := cmp.Diff([]string{"source=127.0.0.2", "source=127.0.0.3"}, refused); diff != "" {
		t.Errorf("sources logged (-want +got):\n%s\nall lines: %q", diff, lines)
	}
}
