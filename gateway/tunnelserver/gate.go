package tunnelserver

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// handshakeGate bounds the TLS handshakes the listener works on at once,
// and gives a free place to the newest handshake waiting for one.
//
// quic-go makes every Initial of a new client a connection with goroutines
// of its own and starts its handshake at once. When thousands of edges
// dial together (a cold start or a restart of a fleet's gateway), their
// handshakes share the CPU: each takes as long as all of them together,
// many outlive their client's handshake timeout, and those clients dial
// again, with a new handshake, while the gateway still works on the old
// one. The gateway then runs flat out and completes few: at 10,000 edges
// on 2 cores, about 30 registrations a second for half a minute instead
// of 250, and established tunnels, waiting behind the handshakes, timed
// out.
//
// A handshake enters the gate when its ClientHello arrives, before any
// of its cryptography, and leaves it when the client's certificate has
// been checked or the connection ends. While max are in, the others wait
// blocked, which costs a goroutine and no CPU. A place that frees goes
// to the newest waiter (last in, first out): its client is the one surest
// to be waiting still, and the likeliest to finish within its timeout,
// where the oldest has often given up. A waiter that found no place
// within maxWait is refused: its client is about to give up anyway, and
// it dials again after its backoff, to the top of the stack.
//
// A place is also a target: a ClientHello from a forged source address
// holds one until the handshake idle timeout. While half the places are
// held (crowded) and such handshakes were abandoned in numbers lately,
// the listener asks new clients to prove their address with a QUIC Retry
// before their ClientHello counts (retry.go), so forged ones hold at most
// half the places.
type handshakeGate struct {
	max     int
	maxWait time.Duration

	mu      sync.Mutex
	in      atomic.Int32 // handshakes holding a place; changed under mu
	waiting list.List    // of *gateWaiter; the back is the newest
	closed  bool
}

type gateWaiter struct {
	ready    chan struct{} // closed when admitted or the gate closed
	admitted bool          // guarded by the gate's mu
	elem     *list.Element // guarded by the gate's mu; nil once out of the list
}

var (
	errGateBusy   = errors.New("gateway busy: no place for the handshake in time (--max-handshakes)")
	errGateClosed = errors.New("tunnel listener closed")
)

// newHandshakeGate lets max handshakes in at once, each waiting at most
// maxWait for a place; max <= 0 means no bound (a nil gate).
func newHandshakeGate(max int, maxWait time.Duration) *handshakeGate {
	if max <= 0 {
		return nil
	}
	return &handshakeGate{max: max, maxWait: maxWait}
}

// enter waits for a place, until maxWait passes, ctx ends or the gate
// closes. The release it returns gives the place back; it may be called
// more than once.
func (g *handshakeGate) enter(ctx context.Context) (release func(), err error) {
	if g == nil {
		return func() {}, nil
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, errGateClosed
	}
	if int(g.in.Load()) < g.max {
		g.in.Add(1)
		g.mu.Unlock()
		return g.releaser(), nil
	}
	w := &gateWaiter{ready: make(chan struct{})}
	w.elem = g.waiting.PushBack(w)
	g.mu.Unlock()

	t := time.NewTimer(g.maxWait)
	defer t.Stop()
	select {
	case <-w.ready:
	case <-t.C:
		err = errGateBusy
	case <-ctx.Done():
		err = context.Cause(ctx)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case w.admitted: // also when admitted as it gave up: take the place
		return g.releaser(), nil
	case g.closed:
		return nil, errGateClosed
	}
	g.waiting.Remove(w.elem)
	w.elem = nil
	return nil, err
}

// releaser gives a place back once: to the newest waiter, or to the gate.
func (g *handshakeGate) releaser() func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if e := g.waiting.Back(); e != nil && !g.closed {
				w := g.waiting.Remove(e).(*gateWaiter)
				w.elem = nil
				w.admitted = true
				close(w.ready)
				return
			}
			g.in.Add(-1)
		})
	}
}

// close refuses every waiter and every handshake from now on.
func (g *handshakeGate) close() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	g.closed = true
	for e := g.waiting.Front(); e != nil; e = e.Next() {
		w := e.Value.(*gateWaiter)
		w.elem = nil
		close(w.ready)
	}
	g.waiting.Init()
}

// counts says how many handshakes hold a place and how many wait.
func (g *handshakeGate) counts() (in, waiting int) {
	if g == nil {
		return 0, 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return int(g.in.Load()), g.waiting.Len()
}

// isClosed reports whether close was called.
func (g *handshakeGate) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// crowded reports whether half the places or more are held. It takes no
// lock: the listener asks it for every Initial without a token.
func (g *handshakeGate) crowded() bool {
	return g != nil && 2*int(g.in.Load()) >= g.max
}
