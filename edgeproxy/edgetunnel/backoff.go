package edgetunnel

import (
	"math/rand/v2"
	"time"
)

// backoff is a jittered exponential backoff: each wait is drawn from
// [d/2, d), where d doubles from initial up to max. It is not safe for
// concurrent use; each supervisor has its own.
type backoff struct {
	initial, max time.Duration
	cur          time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.initial
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	half := b.cur / 2
	return half + rand.N(half+1)
}

func (b *backoff) reset() { b.cur = 0 }

// atLeast makes the next wait at least d/2: it draws from [d/2, d) unless
// the backoff has grown beyond d already.
func (b *backoff) atLeast(d time.Duration) {
	b.cur = max(b.cur, min(d, b.max)/2)
}
