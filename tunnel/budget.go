package tunnel

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"
)

// ReceiveBudget bounds what the receive windows of all the QUIC
// connections sharing it may grow by, together. quic-go has no limit of
// its own across connections: each connection's window starts at
// InitialConnectionReceiveWindow and auto-tuning may double it up to
// MaxConnectionReceiveWindow, and a peer may keep that much unread in
// the receiver's memory for as long as a reader is slow (see the
// package doc, Receive windows). With a budget, every growth of a
// connection's window beyond its initial size is taken from the budget
// (quic.Config.AllowConnectionWindowIncrease) and given back when the
// connection ends; a connection asking for more than is left keeps the
// window it has, which slows its transfers on long paths but never
// stops them.
//
// It is safe for concurrent use.
type ReceiveBudget struct {
	limit   int64
	refused atomic.Int64

	mu    sync.Mutex
	used  int64                // guarded by mu: granted to live connections
	conns map[*quic.Conn]int64 // guarded by mu: what each live connection was granted
}

// NewReceiveBudget returns a budget of limit bytes of window growth.
func NewReceiveBudget(limit int64) *ReceiveBudget {
	return &ReceiveBudget{limit: limit, conns: make(map[*quic.Conn]int64)}
}

// Limit is the budget's size in bytes.
func (b *ReceiveBudget) Limit() int64 { return b.limit }

// Used is how many bytes of window growth live connections hold.
func (b *ReceiveBudget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Refused counts the window increases refused because the budget was
// spent.
func (b *ReceiveBudget) Refused() int64 { return b.refused.Load() }

// Allow is a quic.Config's AllowConnectionWindowIncrease: it grants
// delta bytes to c if the budget has them. It calls nothing on c but
// Context, which quic-go allows in this callback.
func (b *ReceiveBudget) Allow(c *quic.Conn, delta uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if delta > uint64(b.limit-b.used) {
		b.refused.Add(1)
		return false
	}
	if _, ok := b.conns[c]; !ok {
		// The first grant: give everything back once c ends. If c has
		// ended already, release runs at once in a goroutine of its
		// own, after this call has unlocked.
		context.AfterFunc(c.Context(), func() { b.release(c) })
	}
	b.conns[c] += int64(delta)
	b.used += int64(delta)
	return true
}

// release gives back what c was granted.
func (b *ReceiveBudget) release(c *quic.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= b.conns[c]
	delete(b.conns, c)
}
