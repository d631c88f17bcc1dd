package writequeue

import (
	"testing"
	"time"
)

func TestReplayBackoff(t *testing.T) {
	for failures := 1; failures <= 40; failures++ {
		full := min(replayBackoffBase<<min(failures-1, 20), replayBackoffMax)
		for range 50 {
			if d := replayBackoff(failures, 0); d < full/2 || d > full {
				t.Fatalf("failure %d: waits %v, want within [%v, %v]", failures, d, full/2, full)
			}
		}
	}
	// Retry-After is honoured, up to the bound.
	if d := replayBackoff(1, 30*time.Second); d != 30*time.Second {
		t.Errorf("Retry-After 30s after one failure: %v", d)
	}
	if d := replayBackoff(1, time.Hour); d != replayBackoffMax {
		t.Errorf("Retry-After 1h: %v, want %v", d, replayBackoffMax)
	}
}
