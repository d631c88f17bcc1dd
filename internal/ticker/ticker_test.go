package ticker

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/internal/testenv"
)

// Every calls f once a period, not before the first has passed, and
// stops when f says so.
func TestEveryStopsWhenFSays(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	calls := make(chan int)
	done := make(chan struct{})
	n := 0
	go func() {
		defer close(done)
		Every(context.Background(), clk, time.Second, func() bool {
			n++
			calls <- n
			return n < 3
		})
	}()
	for want := 1; want <= 3; want++ {
		testenv.Eventually(t, "Every waits on its ticker", clk.HasWaiters)
		select {
		case <-calls:
			t.Fatalf("call %d before its period", want)
		default:
		}
		clk.Step(time.Second)
		if got := <-calls; got != want {
			t.Fatalf("call %d, want %d", got, want)
		}
	}
	<-done
}

// Every returns when its context ends, without another call.
func TestEveryEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, nil, time.Hour, func() bool {
			t.Error("f called")
			return true
		})
	}()
	cancel()
	<-done
}

// Sleep waits the whole d by the clock, or reports the context's end.
func TestSleep(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	slept := make(chan bool)
	go func() { slept <- Sleep(ctx, clk, time.Second) }()
	testenv.Eventually(t, "Sleep waits on its timer", clk.HasWaiters)
	clk.Step(time.Second)
	if !<-slept {
		t.Fatal("Sleep reported the context's end after the whole second passed")
	}
	if !Sleep(ctx, clk, 0) {
		t.Fatal("Sleep(0) with a live context reported its end")
	}

	go func() { slept <- Sleep(ctx, clk, time.Hour) }()
	testenv.Eventually(t, "Sleep waits on its timer", clk.HasWaiters)
	cancel()
	if <-slept {
		t.Fatal("Sleep reported a whole hour slept after the context ended")
	}
	if Sleep(ctx, clk, 0) {
		t.Fatal("Sleep(0) with an ended context reported it slept")
	}
}
