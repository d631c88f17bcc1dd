// Package memtrim gives the Go heap's free memory back to the kernel when
// a process falls quiet after a burst of work.
//
// After a burst (an apiserver list of a thousand pods, a resync), the Go
// runtime keeps the heap it grew: garbage is not collected until the heap
// doubles again or two minutes pass, and freed pages go back to the kernel
// slowly. A node agent spends most of its life idle, so that burst-sized
// heap is what it costs the node. Trim collects garbage and returns the
// free pages once the allocation rate has dropped, and only after enough
// was allocated to be worth a collection: a quiet process is never woken
// to do it twice.
package memtrim

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Options tune Run; the zero value gives the defaults.
type Options struct {
	// Every is how often the allocation counter is read (default 5 s).
	Every time.Duration
	// Burst is how many bytes must have been allocated since the last
	// trim for another to be worth it (default 8 MiB).
	Burst uint64
	// Quiet is the most bytes allocated in one Every for the process to
	// count as quiet (default 512 KiB).
	Quiet uint64

	// allocs and free stand in for the runtime in tests.
	allocs func() uint64
	free   func()
}

func (o Options) withDefaults() Options {
	if o.Every <= 0 {
		o.Every = 5 * time.Second
	}
	if o.Burst == 0 {
		o.Burst = 8 << 20
	}
	if o.Quiet == 0 {
		o.Quiet = 512 << 10
	}
	if o.allocs == nil {
		o.allocs = heapAllocs
	}
	if o.free == nil {
		o.free = debug.FreeOSMemory
	}
	return o
}

// Run trims until ctx ends.
func Run(ctx context.Context, opts Options, log *slog.Logger) {
	o := opts.withDefaults()
	t := time.NewTicker(o.Every)
	defer t.Stop()
	prev := o.allocs()
	trimmedAt := prev
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := o.allocs()
		if now-prev < o.Quiet && now-trimmedAt >= o.Burst {
			start := time.Now()
			o.free()
			log.Debug("quiet after a burst: returned free heap memory to the kernel",
				"allocated_since_last", now-trimmedAt, "took", time.Since(start))
			now = o.allocs()
			trimmedAt = now
		}
		prev = now
	}
}

// heapAllocs is the bytes the process has allocated on the heap so far.
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
