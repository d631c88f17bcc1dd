package memtrim

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/testenv"
)

// fake is the runtime as the test sets it. Run reads it only when the
// test lets it (tick), so what Run decides after each read is known
// before the test goes on, however slow the machine; the read right
// after a trim needs no tick.
type fake struct {
	mu        sync.Mutex
	st        Stats
	trims     []time.Time // when each trim began
	kept      uint64      // what a trim does not give back
	afterTrim bool        // the next read is the one after a trim

	ticks chan chan int // a read takes one and answers the trims so far
	stop  chan struct{}
}

func newFake(kept uint64) *fake {
	return &fake{kept: kept, ticks: make(chan chan int), stop: make(chan struct{})}
}

func (f *fake) opts(minInterval time.Duration) Options {
	return Options{Every: time.Millisecond, Quiet: 10, Min: 100, MinInterval: minInterval,
		read: func() Stats {
			f.mu.Lock()
			if f.afterTrim {
				f.afterTrim = false
				defer f.mu.Unlock()
				return f.st
			}
			f.mu.Unlock()
			select {
			case answer := <-f.ticks:
				f.mu.Lock()
				defer f.mu.Unlock()
				answer <- len(f.trims)
				return f.st
			case <-f.stop:
				return Stats{}
			}
		},
		free: func() {
			f.mu.Lock()
			f.trims = append(f.trims, time.Now())
			f.st.Reclaimable = f.kept
			f.afterTrim = true
			f.mu.Unlock()
		}}
}

// run runs Run on f until the test ends.
func (f *fake) run(t *testing.T, minInterval time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Run(ctx, f.opts(minInterval), slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() { cancel(); close(f.stop); <-done })
}

func (f *fake) set(allocated, reclaimable uint64) {
	f.mu.Lock()
	f.st.Allocated += allocated
	f.st.Reclaimable += reclaimable
	f.mu.Unlock()
}

// tick lets Run read the figures once and returns how many trims Run
// had made before that read: every earlier read's decision.
func (f *fake) tick(t *testing.T) int {
	t.Helper()
	answer := make(chan int, 1)
	select {
	case f.ticks <- answer:
		return <-answer
	case <-time.After(30 * time.Second):
		t.Fatal("Run stopped reading the runtime's figures")
		return 0
	}
}

// ticksWithout lets Run read n times and fails unless the count of trims
// before each read is trims: no read but the last (whose decision the
// next tick shows) made one.
func (f *fake) ticksWithout(t *testing.T, n int, trims int, what string) {
	t.Helper()
	for range n {
		if got := f.tick(t); got != trims {
			t.Fatalf("%d trims %s, want %d", got, what, trims)
		}
	}
}

func TestRunTrimsWhenQuietAndWorthIt(t *testing.T) {
	f := newFake(0)
	f.run(t, time.Hour)
	f.tick(t) // Run's first read, its starting point

	// Quiet, but nothing to give back.
	f.set(0, 50)
	f.ticksWithout(t, 5, 0, "with 50 bytes to give back")
	// Much to give back, but busy: no trim while it allocates.
	for range 5 {
		f.set(60, 60)
		f.ticksWithout(t, 1, 0, "while allocating")
	}
	// Quiet: one trim. The first tick's read sees no allocation since the
	// last; the second tick shows what Run decided.
	f.ticksWithout(t, 1, 0, "while allocating")
	if n := f.tick(t); n != 1 {
		t.Fatalf("%d trims once quiet, want 1", n)
	}
	// Worth it again at once, and quiet: not before MinInterval (an hour).
	f.set(0, 500)
	f.ticksWithout(t, 5, 1, "within MinInterval of the last")
}

// Once MinInterval has passed since the last trim, Run trims again; never
// sooner, however the reads fall.
func TestRunTrimsAgainAfterMinInterval(t *testing.T) {
	const minInterval = 50 * time.Millisecond
	f := newFake(0)
	f.run(t, minInterval)
	f.tick(t)
	f.set(0, 500)
	f.tick(t)
	if n := f.tick(t); n != 1 {
		t.Fatalf("%d trims, want 1", n)
	}
	f.set(0, 500)
	testenv.Eventually(t, fmt.Sprintf("a second trim (MinInterval %v)", minInterval), func() bool { return f.tick(t) >= 2 })
	f.mu.Lock()
	gap := f.trims[1].Sub(f.trims[0])
	f.mu.Unlock()
	if gap < minInterval {
		t.Fatalf("second trim %v after the first, within MinInterval %v", gap, minInterval)
	}
}

// What a trim could not give back does not count towards the next one.
func TestRunIgnoresWhatATrimLeaves(t *testing.T) {
	f := newFake(150)
	f.run(t, time.Nanosecond) // every read is past MinInterval
	f.tick(t)

	f.set(0, 300)
	f.tick(t)
	if n := f.tick(t); n != 1 {
		t.Fatalf("%d trims with 300 bytes to give back, want 1", n)
	}
	// 150 left, more than Min (100), but what a trim leaves: quiet and
	// past MinInterval, no second trim.
	f.ticksWithout(t, 5, 1, "of what the last trim left")
	// Min more than that: worth a trim again.
	f.set(0, 100)
	f.tick(t)
	if n := f.tick(t); n != 2 {
		t.Fatalf("%d trims with Min more than the floor, want 2", n)
	}
}

// A large live heap raises both bars: what a small process allocates when
// busy is quiet for a large one, and what is worth a collection of a
// small heap is not worth one of a large heap.
func TestRunBarsRiseWithTheLiveHeap(t *testing.T) {
	f := newFake(0)
	f.mu.Lock()
	f.st.Live = 128_000 // bars: quiet under 4,000 bytes a read, worth 32,000
	f.mu.Unlock()
	f.run(t, time.Nanosecond)
	f.tick(t)

	// 2,000 bytes a read is over Quiet (10) but under 1/32 of the live
	// heap; 10,000 to give back is over Min (100) but under a quarter.
	for range 5 {
		f.set(2000, 2000)
		f.ticksWithout(t, 1, 0, "with less than a quarter of the live heap to give back")
	}
	// 40,000 to give back: worth it, and 2,000 a read is still quiet.
	f.set(2000, 30_000)
	f.tick(t)
	if n := f.tick(t); n != 1 {
		t.Fatalf("%d trims with more than a quarter of the live heap to give back, want 1", n)
	}
	// Busy for this heap (5,000 a read): no trim however much there is.
	for range 5 {
		f.set(5000, 40_000)
		f.ticksWithout(t, 1, 1, "while allocating more than 1/32 of the live heap a read")
	}
}

// The real runtime: garbage and free pages are given back.
func TestRunReturnsTheHeap(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, Options{Every: 50 * time.Millisecond}, slog.New(slog.DiscardHandler))
	}()
	defer func() { cancel(); <-done }()
	// A burst that needs 64 MiB live (the heap grows to hold it), then
	// drops it: the dead objects stay until the heap doubles again.
	for i := range 64 {
		keep = append(keep, make([]byte, 1<<20))
		keep[i][0] = 1
	}
	runtime.GC()
	keep = nil
	// What a process allocates after that is garbage the runtime counts
	// (the dropped objects it cannot know of before it collects).
	for i := range 32 {
		sink = make([]byte, 1<<20)
		sink[i] = 1
	}
	sink = nil
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	if st := ReadStats(); st.Reclaimable < 16<<20 {
		t.Fatalf("after 32 MiB of garbage, %d bytes reclaimable", st.Reclaimable)
	}
	// The trim's collection counts as forced when it ends; the pages go
	// back to the kernel after that, so the held heap is judged until the
	// bound, not at the first sight of the count.
	testenv.EventuallyNoError(t, "a trim after dropping 64 MiB, and the heap given back", func() error {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		held := m.HeapIdle - m.HeapReleased + m.HeapInuse
		switch {
		case m.NumForcedGC == before.NumForcedGC:
			return fmt.Errorf("no trim: in use %d, idle %d, released %d", m.HeapInuse, m.HeapIdle, m.HeapReleased)
		case held > 16<<20:
			return fmt.Errorf("after the trim the heap holds %d MiB", held>>20)
		}
		return nil
	})
}

var (
	keep [][]byte
	sink []byte
)
