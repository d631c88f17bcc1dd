package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tether-edge/tether/e2e/benchkit"
)

// mode is one way of reaching a stand-in server.
type mode struct {
	name, desc string
	url        string // base URL of the stand-in, https://addr:port
	pids       []int  // the tether-gateway and tether-edge on the path, if any
	profiled   bool   // they are the profiling build
	bulkOnly   bool
	bare       *bareQUIC // set for bare quic-go
	client     *client   // how to reach url; nil: the bench's client (from the client host, routed as the world routes)
}

// rateResult is one new-connection measurement.
type rateResult struct {
	reqs, errs int
	firstErr   error
	elapsed    time.Duration
	lat        []time.Duration // sorted once complete
}

func (r rateResult) rate() float64 { return float64(r.reqs) / r.elapsed.Seconds() }

// add adds the requests of c, a part of the measurement.
func (r *rateResult) add(c rateResult) {
	r.reqs += c.reqs
	r.errs += c.errs
	if r.firstErr == nil {
		r.firstErr = c.firstErr
	}
	r.elapsed += c.elapsed
	r.lat = append(r.lat, c.lat...)
}

// pct is the p-th percentile latency (nearest rank).
func (r rateResult) pct(p float64) time.Duration { return benchkit.Pct(r.lat, p) }

// bulkResult is one bulk transfer.
type bulkResult struct {
	bytes   int64
	elapsed time.Duration
}

// mbps is the throughput in MB/s (10^6 bytes per second).
func (b bulkResult) mbps() float64 { return float64(b.bytes) / 1e6 / b.elapsed.Seconds() }

// result is one run of one mode.
type result struct {
	seq, conc                rateResult
	bulk                     bulkResult
	seqCPU, concCPU, bulkCPU cpuUse
}

// cpuUse is CPU time (user and system) spent by tether-gateway and
// tether-edge together, and by this process (the client and the stand-in
// servers, or both ends of bare quic-go). It depends less than rates on
// what else the machine runs, though not nothing: idle Go runtimes spin
// more or less depending on the load.
type cpuUse struct{ tether, self time.Duration }

func (c cpuUse) sub(d cpuUse) cpuUse { return cpuUse{c.tether - d.tether, c.self - d.self} }
func (c cpuUse) add(d cpuUse) cpuUse { return cpuUse{c.tether + d.tether, c.self + d.self} }
func (c cpuUse) all() time.Duration  { return c.tether + c.self }

// cpu reads the CPU time used so far by this process and by pids.
func cpu(pids []int) cpuUse {
	var c cpuUse
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, p := range pids {
		c.tether += benchkit.CPU(p)
	}
	return c
}

type bench struct {
	o      options
	client *client
	prof   *profiler
}

// clientOf is the client that reaches m.
func (b *bench) clientOf(m mode) *client {
	if m.client != nil {
		return m.client
	}
	return b.client
}

// Requests per turn when the new-connection measurements of the modes
// take turns.
const (
	seqTurn  = 50
	concTurn = 10 // per client
)

// measure runs every mode o.runs times. Within a run the new-connection
// measurements of the modes take turns every few dozen requests, so that
// all see the same load however the machine's load changes; the bulk
// transfers run one after the other, in reverse order every other run.
// The first run is profiled when profiling is on.
func (b *bench) measure(ctx context.Context, modes []mode) (map[string][]result, error) {
	res := map[string][]result{}
	for run := 0; run < b.o.runs; run++ {
		note("run %d/%d", run+1, b.o.runs)
		ms := slices.Clone(modes)
		if run%2 == 1 {
			slices.Reverse(ms)
		}
		rs := map[string]*result{}
		var rate []mode
		for _, m := range ms {
			rs[m.name] = &result{}
			if !m.bulkOnly {
				rate = append(rate, m)
			}
		}
		profile := run == 0 && b.prof != nil
		for _, m := range rate {
			// Warm up: code paths, the tunnel's congestion window, caches.
			r, err := b.clientOf(m).sequential(ctx, m.url, 50)
			if err == nil && r.errs > 0 {
				err = r.firstErr
			}
			if err != nil {
				return nil, fmt.Errorf("%s: warm-up: %w", m.name, err)
			}
		}
		err := b.takeTurns(ctx, profile, "seq", rate, b.o.seq, seqTurn, rs,
			func(m mode, n int) (rateResult, error) { return b.clientOf(m).sequential(ctx, m.url, n) },
			func(r *result) (*rateResult, *cpuUse) { return &r.seq, &r.seqCPU })
		if err == nil {
			err = b.takeTurns(ctx, profile, fmt.Sprintf("c%d", b.o.conc), rate, b.o.concReqs, concTurn*b.o.conc, rs,
				func(m mode, n int) (rateResult, error) { return b.clientOf(m).concurrent(ctx, m.url, b.o.conc, n) },
				func(r *result) (*rateResult, *cpuUse) { return &r.conc, &r.concCPU })
		}
		if err != nil {
			return nil, fmt.Errorf("run %d: %w", run+1, err)
		}
		for _, m := range ms {
			r := rs[m.name]
			if profile {
				if err := b.prof.start(m.name+"-bulk", m.profiled); err != nil {
					return nil, err
				}
			}
			before := cpu(m.pids)
			if m.bare != nil {
				r.bulk, err = m.bare.bulk(ctx, b.o.bulk)
			} else {
				r.bulk, err = b.clientOf(m).bulk(ctx, m.url, b.o.bulk)
			}
			r.bulkCPU = cpu(m.pids).sub(before)
			if profile {
				b.prof.stop()
			}
			if err != nil {
				return nil, fmt.Errorf("%s, run %d: %w", m.name, run+1, err)
			}
		}
		for _, m := range modes {
			res[m.name] = append(res[m.name], *rs[m.name])
		}
	}
	return res, nil
}

// takeTurns makes n requests with do for every mode, turn requests at a
// time, the modes taking turns, and adds results and CPU time to rs
// through field. More than 1% failed requests fail the measurement.
func (b *bench) takeTurns(ctx context.Context, profile bool, metric string, modes []mode, n, turn int, rs map[string]*result,
	do func(mode, int) (rateResult, error), field func(*result) (*rateResult, *cpuUse)) error {
	if profile {
		if err := b.prof.start(metric, true); err != nil {
			return err
		}
		defer b.prof.stop()
	}
	for done := 0; done < n; done += turn {
		k := min(turn, n-done)
		for _, m := range modes {
			before := cpu(m.pids)
			r, err := do(m, k)
			rr, c := field(rs[m.name])
			*c = c.add(cpu(m.pids).sub(before))
			rr.add(r)
			if err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
		}
	}
	for _, m := range modes {
		rr, _ := field(rs[m.name])
		slices.Sort(rr.lat)
		if rr.errs*100 > n {
			return fmt.Errorf("%s: %d of %d requests failed; first: %w", m.name, rr.errs, n, rr.firstErr)
		}
	}
	return nil
}

// client makes HTTPS requests from the cloud client host, trusting only
// the stand-ins' CA (so every request proves TLS ran end to end).
type client struct {
	perRequest *http.Client // a new TCP connection and TLS handshake per request
	bulkClient *http.Client
	dial       func(context.Context, string, string) (net.Conn, error)
	tlsConfig  *tls.Config
}

func newClient(dial benchkit.DialFunc, roots *x509.CertPool) *client {
	return &client{
		perRequest: benchkit.NewConnClient(dial, roots, 10*time.Second),
		bulkClient: benchkit.NewConnClient(dial, roots, 0),
		dial:       dial,
		tlsConfig:  &tls.Config{RootCAs: roots},
	}
}

// get fetches url and checks that it answered 200 with a body.
func (c *client) get(ctx context.Context, url string) error {
	_, err := benchkit.Get(ctx, c.perRequest, url)
	return err
}

// sequential makes n requests to base/healthz one after the other.
func (c *client) sequential(ctx context.Context, base string, n int) (rateResult, error) {
	return c.concurrent(ctx, base, 1, n)
}

// concurrent makes n requests to base/healthz from clients goroutines.
// Failed requests are counted, not timed. The latencies are not sorted.
func (c *client) concurrent(ctx context.Context, base string, clients, n int) (rateResult, error) {
	url := base + "/healthz"
	var next atomic.Int64
	var mu sync.Mutex
	r := rateResult{lat: make([]time.Duration, 0, n)}
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, n/clients+1)
			var errs int
			var first error
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				t0 := time.Now()
				if err := c.get(ctx, url); err != nil {
					errs++
					if first == nil {
						first = err
					}
					continue
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			r.lat = append(r.lat, lat...)
			r.errs += errs
			if r.firstErr == nil {
				r.firstErr = first
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	r.reqs = len(r.lat)
	return r, ctx.Err()
}

// bulk fetches n bytes from base/bytes over one connection.
func (c *client) bulk(ctx context.Context, base string, n int64) (bulkResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	url := fmt.Sprintf("%s/bytes?n=%d", base, n)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return bulkResult{}, err
	}
	start := time.Now()
	resp, err := c.bulkClient.Do(req)
	if err != nil {
		return bulkResult{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return bulkResult{}, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	got, err := drain(resp.Body)
	if err != nil {
		return bulkResult{}, fmt.Errorf("GET %s: after %d bytes: %w", url, got, err)
	}
	if got != n {
		return bulkResult{}, fmt.Errorf("GET %s: %d bytes, want %d", url, got, n)
	}
	return bulkResult{bytes: got, elapsed: time.Since(start)}, nil
}

// drain reads r to its end in 64 KiB reads (io.Discard would read in
// 8 KiB ones) and returns the byte count.
func drain(r io.Reader) (int64, error) {
	buf := make([]byte, 64<<10)
	var total int64
	for {
		n, err := r.Read(buf)
		total += int64(n)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
