package memtrim

import (
	"context"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// fake is an allocation counter the test moves, and a count of trims.
type fake struct {
	allocs atomic.Uint64
	trims  atomic.Int64
	ticks  chan struct{} // receives after each read of the counter
}

func (f *fake) opts() Options {
	return Options{Every: time.Millisecond, Burst: 100, Quiet: 10,
		allocs: func() uint64 {
			select {
			case f.ticks <- struct{}{}:
			default:
			}
			return f.allocs.Load()
		},
		free: func() { f.trims.Add(1) }}
}

// tick waits for n reads of the counter.
func (f *fake) tick(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-f.ticks:
		case <-time.After(5 * time.Second):
			t.Fatal("Run stopped reading the counter")
		}
	}
}

func TestRunTrimsOnceAfterABurst(t *testing.T) {
	f := &fake{ticks: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Run(ctx, f.opts(), slog.New(slog.DiscardHandler)) }()
	defer func() { cancel(); <-done }()

	f.tick(t, 3)
	if n := f.trims.Load(); n != 0 {
		t.Fatalf("%d trims with nothing allocated", n)
	}
	// A burst: trims wait while allocation goes on.
	for range 5 {
		f.allocs.Add(60)
		f.tick(t, 1)
	}
	if n := f.trims.Load(); n != 0 {
		t.Fatalf("%d trims while allocating", n)
	}
	// Quiet after it: one trim, not one per tick.
	f.tick(t, 5)
	if n := f.trims.Load(); n != 1 {
		t.Fatalf("%d trims after one burst, want 1", n)
	}
	// Slow allocation (under Quiet per tick) adds up to a burst: trimmed
	// once more when it is reached.
	for range 30 {
		f.allocs.Add(5)
		f.tick(t, 1)
	}
	if n := f.trims.Load(); n != 2 {
		t.Fatalf("%d trims after 150 bytes of slow allocation, want 2", n)
	}
}

// The real runtime: after a burst of garbage, Run gives the heap back.
func TestRunReturnsTheHeap(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Run(ctx, Options{Every: 50 * time.Millisecond}, slog.New(slog.DiscardHandler)) }()
	defer func() { cancel(); <-done }()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range 64 {
		sink = make([]byte, 1<<20)
		sink[i] = 1
	}
	sink = nil
	deadline := time.Now().Add(5 * time.Second)
	for {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		if m.NumForcedGC > before.NumForcedGC {
			if held := m.HeapIdle - m.HeapReleased + m.HeapInuse; held > 16<<20 {
				t.Fatalf("after the trim the heap holds %d MiB", held>>20)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no trim 5 s after a burst of 64 MiB: in use %d, idle %d, released %d", m.HeapInuse, m.HeapIdle, m.HeapReleased)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var sink []byte
