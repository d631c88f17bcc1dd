// Package memtrim gives the Go heap's free memory back to the kernel when
// a process is quiet.
//
// After a burst (an apiserver list of a thousand pods, a resync), the Go
// runtime keeps the heap it grew: garbage is not collected until the heap
// doubles again or two minutes pass, and freed pages go back to the kernel
// slowly, a part of them never while the heap may grow again. A node agent
// spends most of its life idle, so that heap is what it costs the node.
// Run collects garbage and returns the free pages when the allocation
// rate is low and doing so gives back enough memory to be worth a
// collection, at most once per MinInterval. Both bars rise with the live
// heap, because a collection's cost does: tether-gateway at 10,000 edges
// holds about 500 MiB of live heap and allocates several MiB every 5 s
// for keepalives alone; with fixed bars it would seldom count as quiet (a
// cold start's 400 MiB of garbage stayed for two minutes), and then
// collect every MinInterval for a few MiB. With these, an idle process
// collects once its garbage reaches a quarter of its live heap (one such
// trim of the gateway took 0.43 s).
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
	// Every is how often the runtime's figures are read (default 5 s).
	Every time.Duration
	// Quiet is the most bytes allocated in one Every for the process to
	// count as quiet (default 512 KiB), or 1/32 of the live heap if
	// that is more.
	Quiet uint64
	// Min is the least memory a trim must be expected to give back: free
	// heap pages not returned to the kernel, and what was allocated since
	// the last collection (default 2 MiB), or a quarter of the live heap
	// if that is more.
	Min uint64
	// MinInterval is the least time between two trims (default 30 s).
	MinInterval time.Duration

	// read and free stand in for the runtime in tests.
	read func() Stats
	free func()
}

// Stats are the runtime's figures Run decides by.
type Stats struct {
	// Allocated is the bytes allocated on the heap so far.
	Allocated uint64
	// Reclaimable estimates what a collection and scavenge would give
	// back: free heap pages the kernel has not got back, and the heap
	// allocated since the last collection (objects that died since are
	// not known until the next one).
	Reclaimable uint64
	// Live is the heap the last collection found live.
	Live uint64
}

// bars returns the quiet and worth-it bars for a live heap of live bytes.
func (o Options) bars(live uint64) (quiet, min uint64) {
	return max(o.Quiet, live/32), max(o.Min, live/4)
}

func (o Options) withDefaults() Options {
	if o.Every <= 0 {
		o.Every = 5 * time.Second
	}
	if o.Quiet == 0 {
		o.Quiet = 512 << 10
	}
	if o.Min == 0 {
		o.Min = 2 << 20
	}
	if o.MinInterval <= 0 {
		o.MinInterval = 30 * time.Second
	}
	if o.read == nil {
		o.read = ReadStats
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
	prev := o.read().Allocated
	var last time.Time
	var floor uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := o.read()
		quietBar, minGain := o.bars(st.Live)
		quiet := st.Allocated-prev < quietBar
		prev = st.Allocated
		// floor is what the last trim left: the estimate counts some
		// memory a trim does not give back (about 2 MiB in tether-edge),
		// and without it an idle process would collect every MinInterval
		// for nothing.
		if !quiet || st.Reclaimable < floor+minGain || time.Since(last) < o.MinInterval {
			continue
		}
		start := time.Now()
		o.free()
		last = time.Now()
		after := o.read()
		prev = after.Allocated
		floor = after.Reclaimable
		log.Debug("quiet: returned free heap memory to the kernel",
			"reclaimable_before", st.Reclaimable, "reclaimable_after", after.Reclaimable, "took", last.Sub(start))
	}
}

var statNames = []string{
	"/gc/heap/allocs:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/objects:bytes",
	"/gc/heap/live:bytes",
}

// ReadStats reads the runtime's figures.
func ReadStats() Stats {
	s := make([]metrics.Sample, len(statNames))
	for i, n := range statNames {
		s[i].Name = n
	}
	metrics.Read(s)
	v := make([]uint64, len(s))
	for i := range s {
		if s[i].Value.Kind() == metrics.KindUint64 {
			v[i] = s[i].Value.Uint64()
		}
	}
	st := Stats{Allocated: v[0], Reclaimable: v[1], Live: v[3]}
	if objects, live := v[2], v[3]; objects > live {
		st.Reclaimable += objects - live
	}
	return st
}
