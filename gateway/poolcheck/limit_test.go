package poolcheck

import (
	"testing"
	"time"

	testclock "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/tunnel"
)

// TestLimiter: a sender refused Burst times is limited until a token is
// back, then served again; Unavailable takes no token, other senders are
// not touched, and a full bucket is forgotten.
func TestLimiter(t *testing.T) {
	clk := testclock.NewFakePassiveClock(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
	l := NewLimiter(Limit{Burst: 3, Per: time.Minute}, clk)
	for i := range 10 {
		if l.Refused("edge-1", tunnel.Unavailable) {
			t.Fatal("an Unavailable refusal limited the sender")
		}
		if err := l.Allow("edge-1"); err != nil {
			t.Fatalf("after %d Unavailable refusals: %v", i+1, err)
		}
	}
	for i := range 3 {
		if err := l.Allow("edge-1"); err != nil {
			t.Fatalf("refusal %d: %v, want allowed", i+1, err)
		}
		if limited := l.Refused("edge-1", tunnel.NotLeader); limited != (i == 2) {
			t.Errorf("refusal %d: limited %v", i+1, limited)
		}
	}
	checkRefusal(t, "the 4th", l.Allow("edge-1"), tunnel.RateLimited,
		"sender edge-1 is refused too often (more than 3 refusals per 1m0s): next request in 20s")
	if err := l.Allow("edge-2"); err != nil {
		t.Errorf("another sender: %v", err)
	}

	// One token back after Per/Burst: one request, and refused again it
	// is limited again (not logged twice).
	clk.SetTime(clk.Now().Add(20 * time.Second))
	if err := l.Allow("edge-1"); err != nil {
		t.Fatalf("a token back: %v", err)
	}
	if l.Refused("edge-1", tunnel.OtherPool) {
		t.Error("limited again reported a second time before the bucket was full")
	}
	checkRefusal(t, "after the token", l.Allow("edge-1"), tunnel.RateLimited,
		"sender edge-1 is refused too often (more than 3 refusals per 1m0s): next request in 20s")

	// After Per the bucket is full: forgotten.
	clk.SetTime(clk.Now().Add(time.Minute))
	if err := l.Allow("edge-1"); err != nil {
		t.Fatalf("after the window: %v", err)
	}
	if n := l.Senders(); n != 0 {
		t.Errorf("%d senders kept with full buckets, want 0", n)
	}
	if l.Refused("edge-1", tunnel.NotLeader) {
		t.Error("one refusal of a full bucket: limited")
	}
}

func TestLimiterDefault(t *testing.T) {
	l := NewLimiter(Limit{}, nil)
	for range DefaultLimit.Burst - 1 {
		l.Refused("edge-1", tunnel.BadLease)
	}
	if err := l.Allow("edge-1"); err != nil {
		t.Fatalf("after %d refusals: %v", DefaultLimit.Burst-1, err)
	}
	l.Refused("edge-1", tunnel.BadLease)
	if err := l.Allow("edge-1"); codeOf(err) != tunnel.RateLimited {
		t.Errorf("after %d refusals: %v, want rate_limited", DefaultLimit.Burst, err)
	}
}
