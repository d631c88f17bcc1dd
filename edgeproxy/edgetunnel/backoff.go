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

// busy makes the next wait one after a busy refusal: drawn from [lo/2, lo)
// the first time, growing as usual, but never beyond [hi/2, hi), however
// far the backoff had grown (all within max).
func (b *backoff) busy(lo, hi time.Duration) {
	b.cur = min(max(b.cur, min(lo, b.max)/2), min(hi, b.max)/2)
}
