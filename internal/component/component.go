// Package component runs the parts of a program with one lifecycle. A
// part has a name and runs until its context ends; it may say whether it
// is ready (Readier), add its part to the program's /status (Reporter)
// and hold resources to free at the end (Closer).
//
// A Group starts its parts in the order they were added and stops them in
// the reverse order, each once the parts added after it have returned: a
// part that others use (a listener, a tunnel) outlives them. Parts added
// in one AddTogether call stop together instead: all are told at once and
// the group waits for them all, for parts that end one another (a proxy
// whose connections end when the tunnels under them close). A part's
// context ends with the cause of the stop: the cause of Run's context, or
// the error of the part that failed. Readiness is
// asked of every part that implements Readier, by interface, as CoreDNS's
// ready plugin asks its plugins: no hand-written switch of parts.
package component

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
)

// Component is one part of a program.
type Component interface {
	// Name names the part in readiness errors and logs ("tunnel",
	// "apiserver-proxy").
	Name() string
	// Run runs the part until ctx ends. A nil return before that ends
	// only this part; an error stops the group.
	Run(ctx context.Context) error
}

// Readier is a part that may not be ready: Ready says why it is not, or
// nil. Parts without it are always ready.
type Readier interface {
	Ready() error
}

// Reporter is a part that fills its part of the status S (the program's
// /status).
type Reporter[S any] interface {
	ReportStatus(*S)
}

// Closer is a part that holds resources from before Run (a listener, an
// open file): Close frees them after Run, or when the program fails
// before it runs the group.
type Closer interface {
	Close() error
}

// Func is a part made of functions; Ready, Status and Close may be nil.
type Func[S any] struct {
	N       string
	RunF    func(ctx context.Context) error
	ReadyF  func() error
	StatusF func(*S)
	CloseF  func() error
}

func (f Func[S]) Name() string                  { return f.N }
func (f Func[S]) Run(ctx context.Context) error { return f.RunF(ctx) }

func (f Func[S]) Ready() error {
	if f.ReadyF == nil {
		return nil
	}
	return f.ReadyF()
}

func (f Func[S]) ReportStatus(s *S) {
	if f.StatusF != nil {
		f.StatusF(s)
	}
}

func (f Func[S]) Close() error {
	if f.CloseF == nil {
		return nil
	}
	return f.CloseF()
}

// Group is the parts of a program. Add them, then Run once; or Close
// alone when building the program failed.
type Group struct {
	// Logger receives a debug line as each part stops; nil discards.
	Logger *slog.Logger

	parts    []Component
	stages   []int // stages[i]: the stage of parts[i]; a stage stops as one
	running  atomic.Bool
	stopping atomic.Bool
	closed   sync.Once
}

// Add appends parts, started after those already added and stopped
// before them, each after those that follow it.
func (g *Group) Add(parts ...Component) {
	for _, p := range parts {
		g.AddTogether(p)
	}
}

// AddTogether appends parts that start after those already added and stop
// together, before them: their contexts end at once, and the parts added
// earlier stop once all of them have returned.
func (g *Group) AddTogether(parts ...Component) {
	if len(parts) == 0 {
		return
	}
	stage := 0
	if n := len(g.stages); n > 0 {
		stage = g.stages[n-1] + 1
	}
	for _, p := range parts {
		g.parts = append(g.parts, p)
		g.stages = append(g.stages, stage)
	}
}

// Run starts every part and runs them until ctx ends or one fails, then
// stops them in the reverse order of Add, each after those added later
// have returned (AddTogether's parts as one), and closes the Closers. It
// returns the first error of a part.
func (g *Group) Run(ctx context.Context) error {
	if g.running.Swap(true) {
		return errors.New("component: Run called twice")
	}
	defer g.Close()
	log := g.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	type running struct {
		stop context.CancelCauseFunc
		done chan struct{}
	}
	var (
		mu       sync.Mutex
		first    error
		failed   = make(chan struct{})
		failOnce sync.Once
	)
	rs := make([]running, len(g.parts))
	for i, p := range g.parts {
		pctx, stop := context.WithCancelCause(context.WithoutCancel(ctx))
		rs[i] = running{stop: stop, done: make(chan struct{})}
		go func() {
			defer close(rs[i].done)
			err := p.Run(pctx)
			log.Debug("component stopped", "component", p.Name(), "err", err)
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				failOnce.Do(func() { close(failed) })
			}
		}()
	}
	select {
	case <-ctx.Done():
	case <-failed:
	}
	g.stopping.Store(true)
	cause := context.Cause(ctx)
	if ctx.Err() == nil {
		mu.Lock()
		cause = first
		mu.Unlock()
	}
	for end := len(rs); end > 0; {
		start := end - 1
		for start > 0 && g.stages[start-1] == g.stages[end-1] {
			start--
		}
		for i := end - 1; i >= start; i-- {
			rs[i].stop(cause)
		}
		for i := end - 1; i >= start; i-- {
			<-rs[i].done
		}
		end = start
	}
	mu.Lock()
	defer mu.Unlock()
	return first
}

// Close closes the parts that are Closers, in the reverse order of Add,
// once; Run does it when it returns.
func (g *Group) Close() error {
	var errs []error
	g.closed.Do(func() {
		for i := len(g.parts) - 1; i >= 0; i-- {
			if c, ok := g.parts[i].(Closer); ok {
				if err := c.Close(); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", g.parts[i].Name(), err))
				}
			}
		}
	})
	return errors.Join(errs...)
}

// Ready is nil when the group runs, is not stopping and every Readier
// part is ready; otherwise it says why, naming the parts.
func (g *Group) Ready() error {
	switch {
	case g.stopping.Load():
		return errors.New("shutting down")
	case !g.running.Load():
		return errors.New("not running")
	}
	var errs []error
	for _, p := range g.parts {
		if r, ok := p.(Readier); ok {
			if err := r.Ready(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// Status fills st from every part of g that reports an S, in the order
// of Add.
func Status[S any](g *Group, st *S) {
	for _, p := range g.parts {
		if r, ok := p.(Reporter[S]); ok {
			r.ReportStatus(st)
		}
	}
}
