package netrules

import (
	"context"
	"net/netip"
	"sync"
)

// Fake is an in-memory Rules for tests of the code that drives netrules
// (the gateway's node watcher). It records what it is asked, can be told
// to fail, and traces a connection through what it holds (Trace).
type Fake struct {
	mu      sync.Mutex
	desired *Desired
	state   *state // desired, normalized as the backends render it
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
	st, err := normalize(d)
	if err != nil {
		return err
	}
	if f.err != nil {
		return f.err
	}
	f.desired, f.state, f.cleaned = &d, st, false
	return nil
}

// Trace follows a TCP connection to dst through the rules of the last
// successful Apply, as the kernel would: it returns the port of the
// transparent listener the connection is redirected to, and false if it
// goes to dst untouched. A destination in a pod range is redirected
// whatever its port; an edge address only on a proxied port.
func (f *Fake) Trace(dst netip.AddrPort) (listener uint16, redirected bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.state.redirects(dst.Addr().Unmap(), dst.Port()) {
		return 0, false
	}
	return f.state.proxyPort, true
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
	f.desired, f.state, f.cleaned = nil, nil, true
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
