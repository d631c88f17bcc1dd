package netrules

import (
	"context"
	"sync"
)

// Fake is an in-memory Rules for tests of the code that drives netrules
// (the gateway's node watcher). It records what it is asked and can be
// told to fail.
type Fake struct {
	mu      sync.Mutex
	desired *Desired
	applies int
	flushes int
	cleaned bool
	err     error
}

var _ Rules = (*Fake)(nil)

// Apply records d unless a failure was set with SetErr. An invalid d is
// an error, as with the real backends.
func (f *Fake) Apply(_ context.Context, d Desired) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applies++
	if _, err := normalize(d); err != nil {
		return err
	}
	if f.err != nil {
		return f.err
	}
	f.desired, f.cleaned = &d, false
	return nil
}

// FlushConntrack counts the call; see Flushes.
func (f *Fake) FlushConntrack(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flushes++
	return nil
}

// Cleanup forgets the desired state.
func (f *Fake) Cleanup(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.desired, f.cleaned = nil, true
	return nil
}

func (*Fake) Backend() string { return "fake" }

// Desired returns the state of the last successful Apply, and false if
// there was none (or Cleanup ran since).
func (f *Fake) Desired() (Desired, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.desired == nil {
		return Desired{}, false
	}
	return *f.desired, true
}

// Applies returns how many times Apply was called.
func (f *Fake) Applies() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applies
}

// Flushes returns how many times FlushConntrack was called.
func (f *Fake) Flushes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.flushes
}

// CleanedUp reports whether Cleanup ran after the last successful Apply.
func (f *Fake) CleanedUp() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cleaned
}

// SetErr makes Apply and Cleanup fail with err (nil to succeed again).
func (f *Fake) SetErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}
