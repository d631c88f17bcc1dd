// Package accept keeps a server's accept loop alive through errors that
// pass: out of file descriptors (EMFILE, ENFILE), out of buffers, a
// connection aborted before it was accepted. Listen wraps a listener so
// that Accept waits and retries instead of failing, and fails only once the
// listener is closed; a server built on it (net/http's, or a loop of one's
// own) therefore ends only at shutdown. Backoff is the same policy for
// loops that read from a socket instead.
//
// A streak of failures is logged once, when it starts (warn), and once when
// it ends (info, with its count); every failure is counted. The wait after
// a failure starts at MinBackoff and doubles up to MaxBackoff, as net/http
// does for temporary errors, so an exhausted process is not spun on but
// takes new connections within a second of the condition clearing.
package accept

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// The wait after a failure: MinBackoff after the first of a streak,
// doubling up to MaxBackoff.
const (
	MinBackoff = 5 * time.Millisecond
	MaxBackoff = time.Second
)

// Options name a listener and say where its failures go.
type Options struct {
	// Name names the listener in logs (attribute "listener").
	Name string
	// Logger receives the streak lines; nil discards them.
	Logger *slog.Logger
	// Errors counts every failure; nil counts nothing. See Counter.
	Errors prometheus.Counter
	// Clock times the waits; nil means the real clock.
	Clock clock.Clock
}

// Backoff paces the retries of one listener or socket: Wait after each
// failure, Succeeded after each success. It is safe for concurrent use;
// the loops sharing one share its streak.
type Backoff struct {
	opts    Options
	failing atomic.Bool // a streak is on: Succeeded has work to do

	mu       sync.Mutex
	wait     time.Duration // the last wait of the streak
	failures int
	since    time.Time
}

// NewBackoff returns a Backoff for the listener o names.
func NewBackoff(o Options) *Backoff {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Backoff{opts: o}
}

// Wait records err as a failure and waits before the caller tries again.
// It returns false, at once, if done is closed before the wait is over.
func (b *Backoff) Wait(done <-chan struct{}, err error) bool {
	if b.opts.Errors != nil {
		b.opts.Errors.Inc()
	}
	b.mu.Lock()
	if b.failures == 0 {
		b.since = b.opts.Clock.Now()
		b.failing.Store(true)
		b.opts.Logger.Warn("listener failing; retrying with backoff, further errors are counted until it recovers",
			"listener", b.opts.Name, "err", err, "max_backoff", MaxBackoff)
	}
	b.failures++
	b.wait = min(max(2*b.wait, MinBackoff), MaxBackoff)
	d := b.wait
	b.mu.Unlock()

	t := b.opts.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-done:
		return false
	}
}

// Succeeded ends the streak of failures, if one is on.
func (b *Backoff) Succeeded() {
	if !b.failing.Load() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures == 0 {
		return
	}
	b.opts.Logger.Info("listener recovered", "listener", b.opts.Name, "errors", b.failures,
		"after", b.opts.Clock.Since(b.since).Round(time.Millisecond))
	b.failures, b.wait = 0, 0
	b.failing.Store(false)
}

// Listen returns ln wrapped so that a failed Accept is retried after a
// backoff (see the package doc) instead of returned. Accept returns an
// error only once ln is closed: then at once, also in the middle of a wait.
func Listen(ln net.Listener, o Options) net.Listener {
	return &listener{Listener: ln, backoff: NewBackoff(o), closed: make(chan struct{})}
}

type listener struct {
	net.Listener
	backoff   *Backoff
	closeOnce sync.Once
	closed    chan struct{}
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			l.backoff.Succeeded()
			return c, nil
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		select {
		case <-l.closed:
			return nil, l.closedError()
		default:
		}
		if !l.backoff.Wait(l.closed, err) {
			return nil, l.closedError()
		}
	}
}

func (l *listener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

func (l *listener) closedError() error {
	return &net.OpError{Op: "accept", Net: l.Addr().Network(), Addr: l.Addr(), Err: net.ErrClosed}
}
