package testenv

import (
	"fmt"
	"sync/atomic"
	"testing"
)

// recorder is a T that records a failure instead of stopping the test.
type recorder struct {
	failed string
}

func (r *recorder) Helper()                        {}
func (r *recorder) Cleanup(func())                 {}
func (r *recorder) Logf(string, ...any)            {}
func (r *recorder) Fatalf(format string, a ...any) { r.failed = fmt.Sprintf(format, a...) }

func TestEventually(t *testing.T) {
	var n atomic.Int32
	r := &recorder{}
	Eventually(r, "the third call", func() bool { return n.Add(1) == 3 })
	if r.failed != "" || n.Load() != 3 {
		t.Fatalf("Eventually failed %q after %d calls, want success after 3", r.failed, n.Load())
	}

	r = &recorder{}
	EventuallyWithin(r, 0, "nothing", func() bool { return false })
	if r.failed == "" {
		t.Fatal("EventuallyWithin passed a condition that never held")
	}

	r = &recorder{}
	calls := 0
	EventuallyNoError(r, "no error", func() error {
		calls++
		if calls < 2 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	if r.failed != "" {
		t.Fatalf("EventuallyNoError failed: %s", r.failed)
	}
}

func TestNever(t *testing.T) {
	// The event comes and bad never held: pass.
	var n atomic.Int32
	r := &recorder{}
	Never(r, "bad held", func() bool { return false }, func() bool { return n.Add(1) >= 3 })
	if r.failed != "" {
		t.Fatalf("Never failed: %s", r.failed)
	}

	// bad holds before the event: fail.
	r = &recorder{}
	n.Store(0)
	Never(r, "bad held", func() bool { return n.Load() >= 2 }, func() bool { return n.Add(1) >= 5 })
	if r.failed != "bad held" {
		t.Fatalf("Never reported %q, want %q", r.failed, "bad held")
	}

	// bad and the event come together: fail, the last look sees bad.
	r = &recorder{}
	var done atomic.Bool
	Never(r, "bad held", done.Load, func() bool { done.Store(true); return true })
	if r.failed != "bad held" {
		t.Fatalf("Never reported %q, want %q", r.failed, "bad held")
	}
}

func TestSkipShortOutsideTests(t *testing.T) {
	// A T that is no testing.TB (the demo's Session) is never skipped.
	r := &recorder{}
	SkipShort(r)
	if r.failed != "" {
		t.Fatalf("SkipShort failed a non-test T: %s", r.failed)
	}
}
