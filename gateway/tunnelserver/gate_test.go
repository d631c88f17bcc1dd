package tunnelserver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/testenv"
)

// enterAsync calls enter in a goroutine and delivers its result.
func enterAsync(ctx context.Context, g *handshakeGate) <-chan gateResult {
	ch := make(chan gateResult, 1)
	go func() {
		release, err := g.enter(ctx)
		ch <- gateResult{release, err}
	}()
	return ch
}

type gateResult struct {
	release func()
	err     error
}

// waitCounts polls the gate until it holds in and waiting, or fails.
func waitCounts(t *testing.T, g *handshakeGate, in, waiting int) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("the gate to hold %d and have %d waiting", in, waiting), func() bool {
		gi, gw := g.counts()
		return gi == in && gw == waiting
	})
}

func recv(t *testing.T, ch <-chan gateResult) gateResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("enter did not return")
		return gateResult{}
	}
}

// A free place goes to the newest waiter first.
func TestGateAdmitsNewestFirst(t *testing.T) {
	g := newHandshakeGate(1, time.Hour)
	first, err := g.enter(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	old := enterAsync(t.Context(), g)
	waitCounts(t, g, 1, 1)
	newer := enterAsync(t.Context(), g)
	waitCounts(t, g, 1, 2)

	first()
	r := recv(t, newer)
	if r.err != nil {
		t.Fatalf("newest waiter: %v", r.err)
	}
	waitCounts(t, g, 1, 1)
	select {
	case <-old:
		t.Fatal("the oldest waiter got the place before the newest gave it back")
	default:
	}
	r.release()
	r.release() // once only: a second call must not free another place
	if r := recv(t, old); r.err != nil {
		t.Fatalf("oldest waiter: %v", r.err)
	} else {
		r.release()
	}
	waitCounts(t, g, 0, 0)
}

// max places are handed out without waiting, and no more.
func TestGateBoundsPlaces(t *testing.T) {
	g := newHandshakeGate(3, time.Hour)
	var releases []func()
	for range 3 {
		r, err := g.enter(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, r)
	}
	fourth := enterAsync(t.Context(), g)
	waitCounts(t, g, 3, 1)
	releases[1]()
	r := recv(t, fourth)
	if r.err != nil {
		t.Fatal(r.err)
	}
	waitCounts(t, g, 3, 0)
	r.release()
	releases[0]()
	releases[2]()
	waitCounts(t, g, 0, 0)
}

// A waiter is refused after maxWait, and leaves no trace.
func TestGateRefusesAfterMaxWait(t *testing.T) {
	g := newHandshakeGate(1, 50*time.Millisecond)
	release, err := g.enter(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.enter(t.Context()); !errors.Is(err, errGateBusy) {
		t.Fatalf("err %v, want errGateBusy", err)
	}
	waitCounts(t, g, 1, 0)
	release()
	waitCounts(t, g, 0, 0)
	if _, err := g.enter(t.Context()); err != nil {
		t.Fatalf("after the place freed: %v", err)
	}
}

// A waiter whose connection ends leaves at once.
func TestGateWaiterContext(t *testing.T) {
	g := newHandshakeGate(1, time.Hour)
	if _, err := g.enter(t.Context()); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("client gone")
	ctx, cancel := context.WithCancelCause(t.Context())
	ch := enterAsync(ctx, g)
	waitCounts(t, g, 1, 1)
	cancel(cause)
	if r := recv(t, ch); !errors.Is(r.err, cause) {
		t.Fatalf("err %v, want %v", r.err, cause)
	}
	waitCounts(t, g, 1, 0)
}

// Closing the gate refuses its waiters and every later handshake; places
// given back after it are not handed on.
func TestGateClose(t *testing.T) {
	g := newHandshakeGate(1, time.Hour)
	release, err := g.enter(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ch := enterAsync(t.Context(), g)
	waitCounts(t, g, 1, 1)
	g.close()
	if r := recv(t, ch); !errors.Is(r.err, errGateClosed) {
		t.Fatalf("waiter: err %v, want errGateClosed", r.err)
	}
	if _, err := g.enter(t.Context()); !errors.Is(err, errGateClosed) {
		t.Fatalf("after close: err %v, want errGateClosed", err)
	}
	release()
	waitCounts(t, g, 0, 0)
	g.close() // twice is fine
}

// No bound: a nil gate lets everything in.
func TestGateUnbounded(t *testing.T) {
	g := newHandshakeGate(0, time.Second)
	if g != nil {
		t.Fatal("max 0 made a gate")
	}
	for range 1000 {
		release, err := g.enter(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	g.close()
	if in, w := g.counts(); in != 0 || w != 0 {
		t.Fatalf("counts %d %d", in, w)
	}
}

// The gate is crowded, and the listener asks for Retry, from half the
// places held; a place given back takes it below again.
func TestGateCrowded(t *testing.T) {
	for _, tc := range []struct{ max, crowdedAt int }{{1, 1}, {2, 1}, {3, 2}, {1024, 512}} {
		g := newHandshakeGate(tc.max, time.Minute)
		var releases []func()
		for held := 0; held <= tc.max; held++ {
			if got, want := g.crowded(), held >= tc.crowdedAt; got != want {
				t.Errorf("max %d, %d held: crowded %v, want %v", tc.max, held, got, want)
			}
			if held == tc.max {
				break
			}
			release, err := g.enter(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			releases = append(releases, release)
		}
		for _, release := range releases {
			release()
		}
		if g.crowded() {
			t.Errorf("max %d: crowded with every place given back", tc.max)
		}
	}
	var unbounded *handshakeGate
	if unbounded.crowded() {
		t.Error("no bound: crowded")
	}
}
