package tunnelserver

import (
	"testing"
	"time"
)

// A flood is threshold abandoned handshakes within one window; it is
// reported once per window and remembered for floodHold after the last
// abandoned handshake that kept it going.
func TestFloodWatch(t *testing.T) {
	w := floodWatch{threshold: 3}
	t0 := time.Unix(1_000_000, 0)
	if w.flooded(t0) {
		t.Fatal("flooded before anything was abandoned")
	}
	// Two in one window, a third in the next: no flood.
	w.abandoned(t0)
	w.abandoned(t0.Add(time.Second))
	if w.abandoned(t0.Add(floodWindow)) || w.flooded(t0.Add(floodWindow)) {
		t.Fatal("a flood from abandoned handshakes in two windows")
	}
	// Three within the window that began at t0+floodWindow.
	t1 := t0.Add(floodWindow + time.Second)
	if w.abandoned(t1) {
		t.Fatal("flood at the second of the window")
	}
	if !w.abandoned(t1.Add(time.Second)) {
		t.Fatal("no flood at the threshold")
	}
	if w.abandoned(t1.Add(2 * time.Second)) {
		t.Fatal("the flood reported twice in one window")
	}
	last := t1.Add(2 * time.Second)
	for _, d := range []time.Duration{0, floodHold / 2, floodHold - time.Nanosecond} {
		if !w.flooded(last.Add(d)) {
			t.Errorf("not flooded %v after the last abandoned handshake", d)
		}
	}
	if w.flooded(last.Add(floodHold)) {
		t.Errorf("still flooded %v after the last abandoned handshake", floodHold)
	}
}

// Abandoned handshakes mean a flood only when they are also floodRatio
// times as many as the answered ones in their window, as a cold start's
// are not.
func TestFloodWatchRatio(t *testing.T) {
	w := floodWatch{threshold: 2}
	t0 := time.Unix(1_000_000, 0)
	for range 3 {
		w.answered(t0)
	}
	for i := range 3*floodRatio - 1 {
		if w.abandoned(t0.Add(time.Second)) {
			t.Fatalf("a flood at %d abandoned against 3 answered", i+1)
		}
	}
	if !w.abandoned(t0.Add(time.Second)) {
		t.Fatalf("no flood at %d abandoned against 3 answered", 3*floodRatio)
	}
	// The next window starts without the answered ones.
	w2 := floodWatch{threshold: 2}
	for range 10 {
		w2.answered(t0)
	}
	w2.abandoned(t0.Add(floodWindow))
	if !w2.abandoned(t0.Add(floodWindow)) {
		t.Fatal("answers of the window before counted against a flood")
	}
}

// The default threshold: an eighth of the places, at least 8.
func TestFloodThreshold(t *testing.T) {
	for _, tc := range []struct{ max, want int }{{1024, 128}, {64, 8}, {16, 8}, {0, 8}} {
		f := startWith(t, func(o *Options) { o.MaxHandshakes = tc.max })
		if got := f.srv.flood.threshold; got != tc.want {
			t.Errorf("--max-handshakes %d: threshold %d, want %d", tc.max, got, tc.want)
		}
	}
}
