package poolcheck

import (
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/tunnel"
)

// Limit is how many refusals a sender may draw: Burst in a row, given
// back at Burst per Per.
type Limit struct {
	Burst int
	Per   time.Duration
}

// DefaultLimit is the Limit of a zero Limit: 20 refusals, given back over
// a minute (one every 3 s).
var DefaultLimit = Limit{Burst: 20, Per: time.Minute}

// Limiter keeps, per sender, a token bucket of refusals: every refused
// request takes a token, and a sender with none left is answered
// tunnel.RateLimited, before any check and without a request to the
// apiserver, until a token is back. A sender whose bucket is full again
// is forgotten. Refusals of tunnel.Unavailable take no token: they are
// the gateway's trouble, not the sender's.
type Limiter struct {
	limit Limit
	clock clock.PassiveClock

	mu      sync.Mutex
	senders map[string]*bucket // guarded by mu; only senders with a token spent
	swept   time.Time          // guarded by mu
}

type bucket struct {
	tokens  float64
	at      time.Time // when tokens was last brought up to date
	limited bool      // ran out since it was last full: logged once
}

// NewLimiter returns a Limiter; a zero limit is DefaultLimit, a nil clock
// the real one.
func NewLimiter(limit Limit, clk clock.PassiveClock) *Limiter {
	if limit.Burst <= 0 || limit.Per <= 0 {
		limit = DefaultLimit
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Limiter{limit: limit, clock: clk, senders: map[string]*bucket{}, swept: clk.Now()}
}

// Allow returns nil if sender may be served, or its tunnel.RateLimited
// Refusal.
func (l *Limiter) Allow(sender string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	b := l.refill(sender, now)
	if b == nil || b.tokens >= 1 {
		return nil
	}
	wait := time.Duration((1 - b.tokens) * float64(l.limit.Per) / float64(l.limit.Burst))
	return Refuse(tunnel.RateLimited, "sender %s is refused too often (more than %s): next request in %s",
		sender, l.limit, wait.Round(time.Millisecond))
}

// Refused takes a token from sender's bucket for a refusal of code, and
// reports whether that left the sender limited for the first time since
// its bucket was last full (for the caller to log once).
func (l *Limiter) Refused(sender string, code tunnel.Code) (limited bool) {
	if code == tunnel.Unavailable || code == tunnel.RateLimited || code == tunnel.OK {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	b := l.refill(sender, now)
	if b == nil {
		b = &bucket{tokens: float64(l.limit.Burst), at: now}
		l.senders[sender] = b
	}
	b.tokens = max(b.tokens-1, 0)
	if b.tokens < 1 && !b.limited {
		b.limited = true
		return true
	}
	return false
}

// refill brings sender's bucket up to now and returns it, or nil when it
// is full (and forgotten). Every Per, full buckets of other senders are
// forgotten too. l.mu is held.
func (l *Limiter) refill(sender string, now time.Time) *bucket {
	if now.Sub(l.swept) >= l.limit.Per {
		l.swept = now
		for s, b := range l.senders {
			if s != sender && l.fill(b, now) {
				delete(l.senders, s)
			}
		}
	}
	b := l.senders[sender]
	if b != nil && l.fill(b, now) {
		delete(l.senders, sender)
		return nil
	}
	return b
}

// fill adds the tokens given back since b.at and reports whether b is
// full.
func (l *Limiter) fill(b *bucket, now time.Time) bool {
	if d := now.Sub(b.at); d > 0 {
		b.tokens += float64(l.limit.Burst) * d.Seconds() / l.limit.Per.Seconds()
		b.at = now
	}
	return b.tokens >= float64(l.limit.Burst)
}

// Senders is how many senders have spent tokens (for tests).
func (l *Limiter) Senders() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.senders)
}

// String describes the limit, for logs.
func (l Limit) String() string { return fmt.Sprintf("%d refusals per %s", l.Burst, l.Per) }
