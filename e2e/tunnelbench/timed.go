package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Time-bounded measurements, for links whose speed is not known in
// advance (loss, rate limits): each runs for a duration, not a count.

// timed makes GETs of base/healthz, each on a new connection, from
// clients goroutines until d has passed. Latencies are sorted; failed
// requests are counted and their durations kept apart in failed.
func (c *client) timed(ctx context.Context, base string, clients int, d time.Duration) (r rateResult, failed []time.Duration) {
	url := base + "/healthz"
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat, fail []time.Duration
			var first error
			for time.Since(start) < d && ctx.Err() == nil {
				t0 := time.Now()
				if err := c.get(ctx, url); err != nil {
					if ctx.Err() != nil {
						break
					}
					fail = append(fail, time.Since(t0))
					if first == nil {
						first = err
					}
					continue
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			r.lat = append(r.lat, lat...)
			failed = append(failed, fail...)
			if r.firstErr == nil {
				r.firstErr = first
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	r.reqs = len(r.lat)
	r.errs = len(failed)
	slices.Sort(r.lat)
	return r, failed
}

// bulkFor reads base/bytes (an endless body) on one connection for d
// and returns the bytes read and the time from the request to the end.
// A read that stalls is ended at d all the same.
func (c *client) bulkFor(ctx context.Context, base string, d time.Duration) (bulkResult, error) {
	var n atomic.Int64
	return c.download(ctx, base, 1<<50, 0, time.After(d), &n)
}

// download fetches n bytes of base/bytes on one connection, reading at
// most rate bytes per second (0: as fast as it comes) and counting them
// in progress; when stop fires first it ends early, without error.
func (c *client) download(ctx context.Context, base string, n, rate int64, stop <-chan time.Time, progress *atomic.Int64) (bulkResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	url := fmt.Sprintf("%s/bytes?n=%d", base, n)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return bulkResult{}, err
	}
	start := time.Now()
	var stopped atomic.Bool
	go func() {
		select {
		case <-stop:
			stopped.Store(true)
			cancel()
		case <-ctx.Done():
		}
	}()
	resp, err := c.bulkClient.Do(req)
	if err != nil {
		if stopped.Load() {
			return bulkResult{elapsed: time.Since(start)}, nil
		}
		return bulkResult{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return bulkResult{}, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	buf := make([]byte, 64<<10)
	var got int64
	for {
		k, err := resp.Body.Read(buf)
		got += int64(k)
		progress.Add(int64(k))
		if rate > 0 && err == nil {
			if ahead := time.Duration(float64(got)/float64(rate)*float64(time.Second)) - time.Since(start); ahead > 0 {
				select {
				case <-time.After(ahead):
				case <-ctx.Done():
				}
			}
		}
		if err != nil {
			r := bulkResult{bytes: got, elapsed: time.Since(start)}
			if stopped.Load() || (errors.Is(err, io.EOF) && got == n) {
				return r, nil
			}
			return r, fmt.Errorf("GET %s: after %d bytes: %w", url, got, err)
		}
	}
}
