// Package ticker runs a function periodically until its context ends: the
// loop that renewals, lock refreshes and certificate re-checks share; and
// waits by a clock until a context ends.
package ticker

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// Every calls f every d, the first time d after it starts, until ctx ends
// or f returns false. clk makes the ticker (nil: the real clock), so that
// a test with a fake clock steps the calls.
func Every(ctx context.Context, clk clock.WithTicker, d time.Duration, f func() bool) {
	if clk == nil {
		clk = clock.RealClock{}
	}
	t := clk.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		if !f() {
			return
		}
	}
}

// Sleep waits d by clk (nil: the real clock), or until ctx ends, and
// reports whether it waited the whole d. A d of zero or less returns at
// once, false if ctx has ended.
func Sleep(ctx context.Context, clk clock.Clock, d time.Duration) bool {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}
