package testenv

import (
	"testing"
	"time"
)

// WaitBound is how long Eventually and Never wait for their event before
// they fail the test: generous, so that a busy 2-core machine never fails a
// test that is only slow. A test that passes never waits this long.
const WaitBound = 60 * time.Second

// Eventually polls cond until it holds and fails the test if it does not
// within WaitBound. what says what was awaited, for the failure message.
//
// It is the one way tests wait for something to happen: never sleep to
// synchronise.
func Eventually(t T, what string, cond func() bool) {
	t.Helper()
	EventuallyWithin(t, WaitBound, what, cond)
}

// EventuallyWithin is Eventually with another bound, for waits that are
// known to take longer (a control plane's first start, a cold build).
func EventuallyWithin(t T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(bound, cond) {
		t.Fatalf("timed out after %v waiting for %s", bound, what)
	}
}

// EventuallyNoError polls f until it returns nil and fails the test with
// f's last error if it does not within WaitBound.
func EventuallyNoError(t T, what string, f func() error) {
	t.Helper()
	var last error
	if !poll(WaitBound, func() bool { last = f(); return last == nil }) {
		t.Fatalf("timed out after %v waiting for %s: %v", WaitBound, what, last)
	}
}

// Never proves a negative: it watches bad until until holds, and fails the
// test if bad held first (or still holds once until does). until is the
// event after which bad would have shown if it were going to: a later
// request answered, a counter that the code under test moves after the
// point where it would have done the bad thing, a retry observed. A bare
// sleep is no such event: on a slow machine it passes without testing
// anything. Never fails too if until does not hold within WaitBound.
func Never(t T, what string, bad, until func() bool) {
	t.Helper()
	var sawBad bool
	ended := poll(WaitBound, func() bool {
		if bad() {
			sawBad = true
			return true
		}
		return until()
	})
	switch {
	case sawBad:
		t.Fatalf("%s", what)
	case !ended:
		t.Fatalf("timed out after %v waiting for the event that ends the watch for %q", WaitBound, what)
	case bad():
		t.Fatalf("%s", what)
	}
}

// poll calls cond until it returns true or bound passes, starting every
// 5 ms and backing off to every 100 ms. It reports whether cond held.
func poll(bound time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(bound)
	interval := 5 * time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
		interval = min(2*interval, 100*time.Millisecond)
	}
}

// SkipShort skips a test run with -short: that loop runs only the tests that
// need no root, no network namespace and no control plane. Every helper
// here that starts one calls it first, so a test that needs one is skipped
// before it builds or starts anything. Outside `go test` (the demo's
// Session) it does nothing.
func SkipShort(t T) {
	tb, ok := t.(testing.TB)
	if !ok || !testing.Short() {
		return
	}
	tb.Helper()
	tb.Skip("needs root, network namespaces or a control plane: skipped with -short")
}
