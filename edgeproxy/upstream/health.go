package upstream

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// HealthOptions tune the health checks. Zero fields take the defaults.
type HealthOptions struct {
	// Path probed on each server; /readyz by default (a server that
	// answers it with 404 is probed on /healthz instead).
	Path string
	// Interval between probes (default 2 s). Probes overlap when one
	// takes longer than Interval, so a dead server fails one probe per
	// Interval once the first has timed out.
	Interval time.Duration
	// Timeout of one probe (default 5 s). A server that answers within
	// it, however slowly, passes.
	Timeout time.Duration
	// FailureThreshold consecutive failures make a healthy server
	// unhealthy (default 3); SuccessThreshold consecutive successes make
	// an unhealthy one healthy (default 2).
	FailureThreshold int
	SuccessThreshold int
}

// Defaults of HealthOptions.
const (
	DefaultHealthPath       = "/readyz"
	DefaultHealthInterval   = 2 * time.Second
	DefaultHealthTimeout    = 5 * time.Second
	DefaultFailureThreshold = 3
	DefaultSuccessThreshold = 2
)

func (o HealthOptions) withDefaults() HealthOptions {
	if o.Path == "" {
		o.Path = DefaultHealthPath
	}
	if o.Interval <= 0 {
		o.Interval = DefaultHealthInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultHealthTimeout
	}
	if o.FailureThreshold <= 0 {
		o.FailureThreshold = DefaultFailureThreshold
	}
	if o.SuccessThreshold <= 0 {
		o.SuccessThreshold = DefaultSuccessThreshold
	}
	return o
}

// hysteresis turns probe results into a health state: the first result
// sets it; after that it flips only after FailureThreshold failures or
// SuccessThreshold successes in a row.
type hysteresis struct {
	failureThreshold, successThreshold int

	known, healthy bool
	fails, oks     int // consecutive results against the current state
}

// observe records a result and reports whether the state changed.
func (h *hysteresis) observe(ok bool) (changed bool) {
	if !h.known {
		h.known, h.healthy = true, ok
		return true
	}
	switch {
	case ok && h.healthy, !ok && !h.healthy:
		h.fails, h.oks = 0, 0
		return false
	case ok:
		h.oks++
		if h.oks >= h.successThreshold {
			h.healthy, h.oks = true, 0
			return true
		}
	default:
		h.fails++
		if h.fails >= h.failureThreshold {
			h.healthy, h.fails = false, 0
			return true
		}
	}
	return false
}

// probeLoop calls probe every interval (at once when kicked, if no probe
// is running) with at most maxInflight probes at a time, and hands each
// result to observe, in the order they complete, until ctx ends. It
// starts with a probe. It never spins: without ticks or kicks it waits.
// decided, if not nil, is told after each tick or kick whether it started
// a probe (tests watch the loop's decisions with it).
func probeLoop(ctx context.Context, clk clock.WithTicker, interval time.Duration, maxInflight int,
	kick <-chan struct{}, probe func(context.Context) error, observe func(error), decided func(started bool)) {
	ticker := clk.NewTicker(interval)
	defer ticker.Stop()
	results := make(chan error, maxInflight)
	inflight := 0
	start := func() {
		inflight++
		go func() { results <- probe(ctx) }()
	}
	decide := func(ok bool) {
		if ok {
			start()
		}
		if decided != nil {
			decided(ok)
		}
	}
	start()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
			decide(inflight < maxInflight)
		case <-kick:
			decide(inflight == 0)
		case err := <-results:
			inflight--
			if ctx.Err() == nil {
				observe(err)
			}
		}
	}
}
