package edgetunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/quic-go/quic-go"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/tunnel"
)

func TestParseTargets(t *testing.T) {
	got, err := ParseTargets([]string{"gw.example.com", "gw.example.com:443", "10.0.0.1", "10.0.0.2:7000", "[fd00::1]:9", "fd00::2", "[fd00::3]"})
	if err != nil {
		t.Fatal(err)
	}
	want := []Target{
		{"gw.example.com", DefaultGatewayPort}, {"gw.example.com", 443}, {"10.0.0.1", DefaultGatewayPort},
		{"10.0.0.2", 7000}, {"fd00::1", 9}, {"fd00::2", DefaultGatewayPort}, {"fd00::3", DefaultGatewayPort},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, bad := range []string{"", ":10262", "gw:0", "gw:http", "gw:70000", "a:b:c", "[fd00::1"} {
		if _, err := ParseTargets([]string{bad}); err == nil {
			t.Errorf("ParseTargets(%q) accepted", bad)
		}
	}
	if _, err := ParseTargets(nil); err == nil {
		t.Error("no entries accepted")
	}
}

func TestResolve(t *testing.T) {
	targets, _ := ParseTargets([]string{"gw.test", "10.0.0.9", "other.test:99"})
	r := &fakeResolver{}
	r.set([]netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("::ffff:10.0.0.2"), netip.MustParseAddr("10.0.0.9")}, nil)
	got, err := resolve(context.Background(), r, targets, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for a, ep := range got {
		names[a.String()] = ep.serverName
	}
	// gw.test resolves to 10.0.0.9 too, and comes first: the first entry
	// naming an address wins it.
	want := map[string]string{
		"10.0.0.1:10262": "gw.test", "10.0.0.2:10262": "gw.test", "10.0.0.9:10262": "gw.test",
		"10.0.0.1:99": "other.test", "10.0.0.2:99": "other.test", "10.0.0.9:99": "other.test",
	}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}

	// A failed lookup keeps that name's previous endpoints; literals stay.
	r.set(nil, errors.New("SERVFAIL"))
	again, err := resolve(context.Background(), r, targets, "gw.override", got)
	if err == nil || !strings.Contains(err.Error(), "SERVFAIL") {
		t.Errorf("err = %v, want the lookup failure", err)
	}
	if len(again) != len(got) {
		t.Errorf("after a failed lookup %d endpoints, want the %d from before", len(again), len(got))
	}
	// Nothing before, lookups failing: only the literal.
	first, _ := resolve(context.Background(), r, targets, "gw.override", nil)
	if len(first) != 1 || first[netip.MustParseAddrPort("10.0.0.9:10262")].serverName != "gw.override" {
		t.Errorf("endpoints %v, want only the literal with the explicit server name", first)
	}
}

func TestAllowList(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	var list atomic.Pointer[[]netip.Addr]
	reads := 0
	src := countingAddrs{fakeAddrs{&list}, &reads}
	set := func(s ...string) {
		var as []netip.Addr
		for _, a := range s {
			as = append(as, netip.MustParseAddr(a))
		}
		list.Store(&as)
	}
	set("10.1.0.5", "fd00::5")
	a := &allowList{ports: []uint16{10250, 10255}, src: src, clock: clk, log: slog.New(slog.DiscardHandler)}
	check := func(dest, want string) {
		t.Helper()
		got := a.check(netip.MustParseAddrPort(dest))
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("check(%s) = %q, want %q", dest, got, want)
		}
	}
	check("10.1.0.5:10250", "")
	check("[fd00::5]:10255", "")
	check("127.0.0.1:10250", "")
	check("127.8.9.1:10255", "")
	check("[::1]:10250", "")
	check("[::ffff:10.1.0.5]:10250", "")
	check("10.1.0.5:22", "port 22 is not in --allow-ports")
	check("127.0.0.1:22", "not in --allow-ports")
	check("10.1.0.6:10250", "10.1.0.6 is not an address of this node")
	check("0.0.0.0:10250", "not an address of this node")

	// A new address is seen once the short minimum age has passed.
	set("10.1.0.5", "10.1.0.6")
	n := reads
	check("10.1.0.6:10250", "not an address") // within the minimum age: no re-read
	if reads != n {
		t.Errorf("addresses re-read %d times within the minimum age", reads-n)
	}
	clk.SetTime(clk.Now().Add(addrsMinAge))
	check("10.1.0.6:10250", "")
	// A vanished address is dropped by the periodic re-read.
	set("10.1.0.6")
	check("10.1.0.5:10250", "")
	clk.SetTime(clk.Now().Add(addrsMaxAge))
	check("10.1.0.5:10250", "not an address")
}

type countingAddrs struct {
	fakeAddrs
	n *int
}

func (c countingAddrs) Addrs() ([]netip.Addr, error) { *c.n++; return c.fakeAddrs.Addrs() }

func TestInterfaceAddrsIncludeLoopback(t *testing.T) {
	as, err := InterfaceAddrs{}.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if a == netip.MustParseAddr("127.0.0.1") {
			return
		}
	}
	t.Errorf("127.0.0.1 not among %v", as)
}

func TestBackoff(t *testing.T) {
	b := backoff{initial: 200 * time.Millisecond, max: 30 * time.Second}
	hi := 200 * time.Millisecond
	for i := 0; i < 12; i++ {
		d := b.next()
		if d < hi/2 || d > hi {
			t.Fatalf("wait %d = %v, want within [%v, %v]", i, d, hi/2, hi)
		}
		hi = min(2*hi, 30*time.Second)
	}
	b.reset()
	if d := b.next(); d > 200*time.Millisecond {
		t.Errorf("after reset: %v", d)
	}
}

// After a busy refusal the wait is drawn from [busyBackoff/2,
// busyBackoff), grows with further refusals to [busyBackoffMax/2,
// busyBackoffMax) and no further, comes down to that from a backoff grown
// by other failures, and stays within max.
func TestBackoffBusy(t *testing.T) {
	b := backoff{initial: 200 * time.Millisecond, max: 30 * time.Second}
	b.busy(busyBackoff, busyBackoffMax)
	if d := b.next(); d < busyBackoff/2 || d >= busyBackoff {
		t.Fatalf("wait after a busy refusal %v, want within [%v, %v)", d, busyBackoff/2, busyBackoff)
	}
	for i := range 5 {
		b.busy(busyBackoff, busyBackoffMax)
		if d := b.next(); d < busyBackoffMax/2 || d >= busyBackoffMax {
			t.Fatalf("wait after busy refusal %d: %v, want within [%v, %v)", i+2, d, busyBackoffMax/2, busyBackoffMax)
		}
	}
	grown := backoff{initial: 200 * time.Millisecond, max: 30 * time.Second}
	for range 10 {
		grown.next()
	}
	grown.busy(busyBackoff, busyBackoffMax)
	if d := grown.next(); d < busyBackoffMax/2 || d >= busyBackoffMax {
		t.Fatalf("wait after a busy refusal, backoff grown to max: %v, want within [%v, %v)", d, busyBackoffMax/2, busyBackoffMax)
	}
	small := backoff{initial: 10 * time.Millisecond, max: time.Second}
	for range 3 {
		small.busy(busyBackoff, busyBackoffMax)
		if d := small.next(); d > time.Second {
			t.Fatalf("wait %v beyond max", d)
		}
	}
}

// What the gateway's refusals look like to the edge.
func TestFailureOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want failure
	}{
		{&quic.TransportError{Remote: true, ErrorCode: 0x150, ErrorMessage: "tls: internal error"}, gatewayBusy},
		{&quic.TransportError{Remote: true, ErrorCode: 0x12a}, identityRefused}, // bad_certificate
		{&quic.TransportError{Remote: false, ErrorCode: 0x150}, gatewayUntrusted},
		{&quic.ApplicationError{Remote: true, ErrorCode: tunnel.CloseNotAllowed}, identityRefused},
		{&quic.ApplicationError{Remote: true, ErrorCode: tunnel.CloseReplaced}, replaced},
		{&quic.IdleTimeoutError{}, otherFailure},
	} {
		if got := failureOf(fmt.Errorf("dial gateway: %w", c.err)); got != c.want {
			t.Errorf("failureOf(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestDialCode(t *testing.T) {
	for err, want := range map[error]tunnel.Code{
		context.DeadlineExceeded:                                                 tunnel.Timeout,
		&net.OpError{Op: "dial", Err: os.ErrDeadlineExceeded}:                    tunnel.Timeout,
		&net.OpError{Op: "dial", Err: errors.New("connect: connection refused")}: tunnel.DialFailed,
		fmt.Errorf("dial: %w", context.Canceled):                                 tunnel.DialFailed,
	} {
		if got := dialCode(err); got != want {
			t.Errorf("dialCode(%v) = %v, want %v", err, got, want)
		}
	}
}
