package benchkit

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Note writes a bench's progress line to w (stderr, or stdout for soak):
// "name: " and the formatted text, after the time of day when stamp is
// set, in one write (notes may come from several goroutines).
func Note(w io.Writer, name string, stamp bool, format string, args ...any) {
	var b strings.Builder
	if stamp {
		b.WriteString(time.Now().Format("15:04:05 "))
	}
	b.WriteString(name + ": ")
	fmt.Fprintf(&b, format, args...)
	b.WriteString("\n")
	io.WriteString(w, b.String())
}

// Sleep waits d, or until ctx ends (its error).
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Parallel calls f(0) .. f(n-1) from workers goroutines. The first error
// stops handing out work and is returned (or ctx's, if it ended first).
func Parallel(ctx context.Context, workers, n int, f func(int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				if err := f(k); err != nil {
					cancel(err)
				}
			}
		}()
	}
	for k := 0; k < n && ctx.Err() == nil; k++ {
		select {
		case next <- k:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

// Progress calls f every interval until the returned stop is called (stop
// returns once f no longer runs).
func Progress(ctx context.Context, interval time.Duration, f func()) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				f()
			}
		}
	}()
	return func() { cancel(); <-done }
}

// Tail is the last n bytes of s, marked with "..." when cut.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
