package memtrim

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"
)

// fake is the runtime as the test sets it, and a count of trims.
type fake struct {
	mu    sync.Mutex
	st    Stats
	trims int
	kept  uint64        // what a trim does not give back
	reads chan struct{} // receives after each read, while the test waits
}

func (f *fake) opts() Options {
	return Options{Every: time.Millisecond, Quiet: 10, Min: 100, MinInterval: 20 * time.Millisecond,
		read: func() Stats {
			f.mu.Lock()
			st := f.st
			f.mu.Unlock()
			select {
			case f.reads <- struct{}{}:
			default:
			}
			return st
		},
		free: func() {
			f.mu.Lock()
			f.trims++
			f.st.Reclaimable = f.kept
			f.mu.Unlock()
		}}
}

// run runs Run on f until the test ends.
func (f *fake) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Run(ctx, f.opts(), slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (f *fake) set(allocated, reclaimable uint64) {
	f.mu.Lock()
	f.st.Allocated += allocated
	f.st.Reclaimable += reclaimable
	f.mu.Unlock()
}

func (f *fake) trimCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.trims
}

// wait waits for n reads.
func (f *fake) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-f.reads:
		case <-time.After(5 * time.Second):
			t.Fatal("Run stopped reading the runtime's figures")
		}
	}
}

func TestRunTrimsWhenQuietAndWorthIt(t *testing.T) {
	f := &fake{reads: make(chan struct{})}
	f.run(t)

	// Quiet, but nothing to give back.
	f.set(0, 50)
	f.wait(t, 5)
	if n := f.trimCount(); n != 0 {
		t.Fatalf("%d trims with %d bytes to give back", n, 50)
	}
	// Much to give back, but busy: no trim while it allocates.
	for range 5 {
		f.set(60, 60)
		f.wait(t, 1)
	}
	if n := f.trimCount(); n != 0 {
		t.Fatalf("%d trims while allocating", n)
	}
	// Quiet: one trim.
	f.wait(t, 3)
	if n := f.trimCount(); n != 1 {
		t.Fatalf("%d trims once quiet, want 1", n)
	}
	// Worth it again at once: not before MinInterval.
	f.set(0, 500)
	f.wait(t, 2)
	if n := f.trimCount(); n != 1 {
		t.Fatalf("%d trims within MinInterval of the last, want 1", n)
	}
	time.Sleep(25 * time.Millisecond)
	f.wait(t, 3)
	if n := f.trimCount(); n != 2 {
		t.Fatalf("%d trims after MinInterval, want 2", n)
	}
}

// What a trim could not give back does not count towards the next one.
func TestRunIgnoresWhatATrimLeaves(t *testing.T) {
	f := &fake{reads: make(chan struct{}), kept: 150}
	f.run(t)

	f.set(0, 300)
	f.wait(t, 3)
	if n := f.trimCount(); n != 1 {
		t.Fatalf("%d trims with 300 bytes to give back, want 1", n)
	}
	// 150 left, more than Min (100), but what a trim leaves: quiet and
	// past MinInterval, no second trim.
	time.Sleep(25 * time.Millisecond)
	f.wait(t, 5)
	if n := f.trimCount(); n != 1 {
		t.Fatalf("%d trims of what the last trim left, want 1", n)
	}
	// Min more than that: worth a trim again.
	f.set(0, 100)
	f.wait(t, 3)
	if n := f.trimCount(); n != 2 {
		t.Fatalf("%d trims with Min more than the floor, want 2", n)
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
	// deadline, not at the first sight of the count.
	deadline := time.Now().Add(5 * time.Second)
	for {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		held := m.HeapIdle - m.HeapReleased + m.HeapInuse
		trimmed := m.NumForcedGC > before.NumForcedGC
		if trimmed && held <= 16<<20 {
			return
		}
		if time.Now().After(deadline) {
			if trimmed {
				t.Fatalf("5 s after the trim the heap holds %d MiB", held>>20)
			}
			t.Fatalf("no trim 5 s after dropping 64 MiB: in use %d, idle %d, released %d", m.HeapInuse, m.HeapIdle, m.HeapReleased)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var (
	keep [][]byte
	sink []byte
)
