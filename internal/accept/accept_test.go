package accept

import (
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/internal/accept/accepttest"
	"github.com/tether-edge/tether/internal/testenv"
)

// logLines returns the lines written to logs.
func logLines(logs *testenv.LogBuffer) []string {
	return strings.Split(strings.TrimSpace(logs.String()), "\n")
}

// waitForTimer waits until the Accept under test sleeps on clk.
func waitForTimer(t *testing.T, clk *testingclock.FakeClock) {
	t.Helper()
	testenv.Eventually(t, "Accept waiting on the clock", clk.HasWaiters)
}

// An EMFILE streak: Accept does not return it, waits 5, 10, 20... ms (not
// less) between the tries, counts every failure, logs the streak once when
// it starts and once when a connection is accepted again.
func TestListenRetries(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := accepttest.New(inner, true)
	clk := testingclock.NewFakeClock(time.Unix(1e9, 0))
	var logs testenv.LogBuffer
	reg := prometheus.NewRegistry()
	errs, err := Counter(reg, "tether_test_accept_errors_total", "dns_tcp")
	if err != nil {
		t.Fatal(err)
	}
	ln := Listen(fl, Options{Name: "dns_tcp", Logger: slog.New(slog.NewTextHandler(&logs, nil)), Errors: errs, Clock: clk})
	defer ln.Close()

	type result struct {
		c   net.Conn
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		got <- result{c, err}
	}()
	for i, wait := range []time.Duration{5, 10, 20, 40} {
		wait *= time.Millisecond
		waitForTimer(t, clk)
		if n := fl.Failures(); n != int64(i+1) {
			t.Fatalf("%d failures before wait %d, want %d", n, i, i+1)
		}
		clk.Step(wait - time.Millisecond)
		if !clk.HasWaiters() {
			t.Fatalf("wait %d ended before %s", i, wait)
		}
		if i == 3 {
			fl.SetFailing(false)
		}
		clk.Step(time.Millisecond)
	}
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := <-got
	if r.err != nil {
		t.Fatalf("Accept: %v", r.err)
	}
	r.c.Close()
	if n := value(t, errs); n != 4 {
		t.Errorf("counted %v errors, want 4", n)
	}
	lines := logLines(&logs)
	if len(lines) != 2 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "too many open files") ||
		!strings.Contains(lines[1], "listener recovered") || !strings.Contains(lines[1], "errors=4") || !strings.Contains(lines[1], "listener=dns_tcp") {
		t.Errorf("log lines:\n%s\nwant one warning with the error, then the recovery with errors=4", strings.Join(lines, "\n"))
	}

	// A second streak starts again from the shortest wait.
	fl.SetFailing(true)
	go func() {
		c, err := ln.Accept()
		got <- result{c, err}
	}()
	waitForTimer(t, clk)
	clk.Step(4 * time.Millisecond)
	if !clk.HasWaiters() {
		t.Fatal("second streak: first wait ended before 5ms")
	}

	// Close ends a wait at once, with an error that says closed.
	ln.Close()
	if r := <-got; !errors.Is(r.err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", r.err)
	}
	if len(logLines(&logs)) != 3 {
		t.Errorf("log lines:\n%s\nwant a third, for the second streak", strings.Join(logLines(&logs), "\n"))
	}
}

// A closed inner listener ends Accept at once, uncounted.
func TestListenClosed(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	errs, _ := Counter(reg, "tether_test_accept_errors_total", "admin")
	ln := Listen(inner, Options{Name: "admin", Errors: errs})
	inner.Close()
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept: %v, want net.ErrClosed", err)
	}
	if n := value(t, errs); n != 0 {
		t.Errorf("counted %v errors", n)
	}
}

// Parts of one program share the counter; each listener has its series
// from the start.
func TestCounterShared(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := Counter(reg, "tether_test_accept_errors_total", "proxy")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Counter(reg, "tether_test_accept_errors_total", "dns_udp")
	if err != nil {
		t.Fatal(err)
	}
	a.Inc()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "tether_test_accept_errors_total" {
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if len(got) != 2 || got["proxy"] != 1 || got["dns_udp"] != 0 || value(t, b) != 0 {
		t.Errorf("series %v, want proxy 1 and dns_udp 0", got)
	}
	if c, err := Counter(nil, "tether_test_accept_errors_total", "x"); c != nil || err != nil {
		t.Errorf("Counter(nil) = %v, %v", c, err)
	}
	other := prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_clash_accept_errors_total"})
	reg.MustRegister(other)
	if _, err := Counter(reg, "tether_clash_accept_errors_total", "x"); err == nil {
		t.Error("no error when another collector has the name")
	}
}

func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
