package component

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

type status struct{ parts []string }

// recorder notes the order in which parts start and stop.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) note(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func part(r *recorder, name string, started chan<- struct{}) Func[status] {
	return Func[status]{N: name,
		RunF: func(ctx context.Context) error {
			r.note("start " + name)
			started <- struct{}{}
			<-ctx.Done()
			r.note("stop " + name)
			return nil
		},
		StatusF: func(s *status) { s.parts = append(s.parts, name) },
		CloseF:  func() error { r.note("close " + name); return nil },
	}
}

// TestGroupStopsInReverseOrder: each part stops only once those added
// after it have returned, and the Closers close after all, in reverse.
func TestGroupStopsInReverseOrder(t *testing.T) {
	r := &recorder{}
	started := make(chan struct{}, 3)
	var g Group
	g.Add(part(r, "a", started), part(r, "b", started), part(r, "c", started))
	if err := g.Ready(); err == nil || err.Error() != "not running" {
		t.Errorf("Ready before Run: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	for range 3 {
		<-started
	}
	if err := g.Ready(); err != nil {
		t.Errorf("Ready while running: %v", err)
	}
	var st status
	Status(&g, &st)
	if !slices.Equal(st.parts, []string{"a", "b", "c"}) {
		t.Errorf("status from %v", st.parts)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := r.seen()[3:]
	want := []string{"stop c", "stop b", "stop a", "close c", "close b", "close a"}
	if !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	if err := g.Ready(); err == nil || err.Error() != "shutting down" {
		t.Errorf("Ready after Run: %v", err)
	}
	if err := g.Run(context.Background()); err == nil {
		t.Error("a second Run was accepted")
	}
}

// TestGroupStopsOnAFailure: a part's error stops the others, in reverse
// order, and is what Run returns; a part that returns nil early stops
// nothing.
func TestGroupStopsOnAFailure(t *testing.T) {
	r := &recorder{}
	started := make(chan struct{}, 2)
	boom := errors.New("boom")
	fail := make(chan struct{})
	var g Group
	g.Add(part(r, "a", started),
		Func[status]{N: "early", RunF: func(context.Context) error { return nil }},
		Func[status]{N: "failing", RunF: func(context.Context) error { <-fail; return boom }},
		part(r, "b", started))
	done := make(chan error, 1)
	go func() { done <- g.Run(context.Background()) }()
	<-started
	<-started
	close(fail)
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the group did not stop after a part failed")
	}
	if got := r.seen()[2:]; !slices.Equal(got, []string{"stop b", "stop a", "close b", "close a"}) {
		t.Errorf("events %v", got)
	}
}

// TestGroupReadyNamesThePartsNotReady: readiness is asked of every part
// that implements Readier.
func TestGroupReadyNamesThePartsNotReady(t *testing.T) {
	started := make(chan struct{}, 1)
	r := &recorder{}
	var g Group
	g.Add(part(r, "ok", started),
		Func[status]{N: "tunnel", RunF: func(ctx context.Context) error { <-ctx.Done(); return nil },
			ReadyF: func() error { return errors.New("not connected to any gateway") }},
		Func[status]{N: "cache", RunF: func(ctx context.Context) error { <-ctx.Done(); return nil },
			ReadyF: func() error { return errors.New("empty") }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-started
	err := g.Ready()
	if err == nil || !strings.Contains(err.Error(), "tunnel: not connected to any gateway") || !strings.Contains(err.Error(), "cache: empty") ||
		strings.Contains(err.Error(), "ok") {
		t.Errorf("Ready: %v", err)
	}
}

// TestGroupCloseWithoutRun: a program that fails while building closes
// what it opened.
func TestGroupCloseWithoutRun(t *testing.T) {
	r := &recorder{}
	var g Group
	g.Add(part(r, "a", nil), part(r, "b", nil))
	g.Close()
	g.Close()
	if got := r.seen(); !slices.Equal(got, []string{"close b", "close a"}) {
		t.Errorf("events %v", got)
	}
}

// TestGroupStopsTogether: the parts of one AddTogether call are told to
// stop at once (each here waits for the other to have been told), and the
// part added before them stops once both have returned.
func TestGroupStopsTogether(t *testing.T) {
	r := &recorder{}
	started := make(chan struct{}, 4)
	told := map[string]chan struct{}{"b": make(chan struct{}), "c": make(chan struct{})}
	together := func(name, other string) Func[status] {
		return Func[status]{N: name, RunF: func(ctx context.Context) error {
			started <- struct{}{}
			<-ctx.Done()
			close(told[name])
			select {
			case <-told[other]:
			case <-time.After(30 * time.Second):
				r.note(name + " stopped alone")
			}
			r.note("stop " + name)
			return nil
		}}
	}
	var g Group
	g.Add(part(r, "a", started))
	g.AddTogether(together("b", "c"), together("c", "b"))
	g.AddTogether()
	g.Add(part(r, "d", started))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	for range 4 {
		<-started
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := r.seen()
	got = got[slices.Index(got, "stop d"):]
	if len(got) < 4 || got[0] != "stop d" || !slices.Contains(got[1:3], "stop b") || !slices.Contains(got[1:3], "stop c") || got[3] != "stop a" {
		t.Errorf("events %v, want d, then b and c, then a", got)
	}
}

// TestGroupStopCause: the parts' contexts end with the cause of the stop,
// the run context's or the error of the part that failed.
func TestGroupStopCause(t *testing.T) {
	causes := make(chan error, 2)
	waiting := func(started chan<- struct{}) Func[status] {
		return Func[status]{N: "waiting", RunF: func(ctx context.Context) error {
			started <- struct{}{}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return nil
		}}
	}
	t.Run("context", func(t *testing.T) {
		started := make(chan struct{}, 1)
		signal := errors.New("terminated")
		var g Group
		g.Add(waiting(started))
		ctx, cancel := context.WithCancelCause(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		<-started
		cancel(signal)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := <-causes; !errors.Is(err, signal) {
			t.Errorf("cause %v, want %v", err, signal)
		}
	})
	t.Run("failure", func(t *testing.T) {
		started := make(chan struct{}, 1)
		boom := errors.New("boom")
		var g Group
		g.Add(waiting(started), Func[status]{N: "failing", RunF: func(context.Context) error { <-started; return boom }})
		if err := g.Run(context.Background()); !errors.Is(err, boom) {
			t.Fatalf("Run: %v", err)
		}
		if err := <-causes; !errors.Is(err, boom) {
			t.Errorf("cause %v, want %v", err, boom)
		}
	})
}
