package tunnelserver

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Address validation (QUIC Retry) against handshakes that hold the gate's
// places and never finish.
//
// A ClientHello from a forged source address takes a place in the gate
// and holds it until the handshake idle timeout (5 s): the client never
// sees the gateway's flight and never answers. About 200 of them a second
// keep 1,024 places full. A Retry stops them, since a client must answer
// it from its address before its handshake starts, but it costs honest
// edges a round trip, and in a cold start of 10,000 edges, with the gate
// full throughout, it cost far more: quic-go sends Retries from one
// goroutine behind a queue of 8 and drops the rest, so edges waited for
// their Initial's retransmission again and again (305,000 Retries, and a
// cold start of 62.6 s against 51.8 s without them, the same day).
//
// So the listener asks for Retry only when both hold:
//   - the gate is crowded (half its places held or more), and
//   - handshakes were abandoned in numbers lately: within one
//     floodWindow, no more than floodHold ago, at least the threshold
//     (an eighth of the places) and floodRatio times as many as were
//     answered. A handshake is abandoned when its connection ends while
//     it holds a place, before the client's certificate came; answered
//     when the certificate came.
//
// A forged client cannot answer: a flood of them abandons every place it
// takes, 5 s after taking it, and answers none. A cold start abandons
// many too, edges that gave up while the gateway was saturated, but
// answers more: 10,000 edges on 2 cores abandoned 0.03 to 1.1 per
// answered in most windows, but up to 6.1 (1,174 against 192) in the
// first window of a slow one. At floodRatio 2, one cold start in four saw
// a flood and, with Retries, took 76.1 s. Places bound the abandoned:
// 1,024 held until the 5 s idle timeout give about 2,000 a window, so at
// floodRatio 10 only a gateway answering fewer than about 200 handshakes
// in 10 s, one already failing, can mistake a cold start for a flood. So within about 5 s of a flood's
// start, and for floodHold after its last burst, new clients prove their
// address, and forged ones hold at most half the places. A flood during a
// cold start goes unnoticed; the newest-first gate still lets edges in.

const (
	floodWindow = 10 * time.Second
	floodHold   = time.Minute
	floodRatio  = 10
)

// floodWatch counts abandoned handshakes in fixed windows and says whether
// a flood was seen within floodHold.
type floodWatch struct {
	threshold int // abandoned handshakes in one window that mean a flood

	mu    sync.Mutex
	start time.Time // of the current window
	n     int       // abandoned in it
	ans   int       // answered in it: the client's certificate came
	told  bool      // abandoned reported the flood in it

	until atomic.Int64 // UnixNano: a flood was seen; Retry until then
}

// abandoned counts one abandoned handshake at now. If the window's counts
// now mean a flood, it keeps Retry on for floodHold from now, and reports
// true the first time in the window (for one log line).
func (w *floodWatch) abandoned(now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.roll(now)
	w.n++
	if w.n < w.threshold || w.n < floodRatio*w.ans {
		return false
	}
	w.until.Store(now.Add(floodHold).UnixNano())
	told := w.told
	w.told = true
	return !told
}

// answered counts a handshake whose client's certificate came.
func (w *floodWatch) answered(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.roll(now)
	w.ans++
}

// roll starts a new window if now is past the current one.
func (w *floodWatch) roll(now time.Time) {
	if now.Sub(w.start) >= floodWindow || now.Before(w.start) {
		w.start, w.n, w.ans, w.told = now, 0, 0, false
	}
}

// flooded reports whether a flood was seen within floodHold of now.
func (w *floodWatch) flooded(now time.Time) bool {
	return now.UnixNano() < w.until.Load()
}

// handshakeAbandoned counts a place given back because the connection
// ended before its client's certificate came, and logs a flood once per
// window in which one is seen.
func (s *Server) handshakeAbandoned() {
	s.abandoned.Inc()
	now := s.now()
	if s.flood.abandoned(now) {
		in, waiting := s.gate.counts()
		s.log.Warn(FloodMessage, "abandoned_within", floodWindow, "threshold", s.flood.threshold,
			"in_progress", in, "waiting", waiting, "max_handshakes", s.gate.max, "for", floodHold)
	}
}

// FloodMessage is the log line of a flood of abandoned handshakes.
const FloodMessage = "tunnel handshakes abandoned in numbers, as in a flood of ClientHellos from forged addresses: new clients must answer a QUIC Retry while half the --max-handshakes places are held (tether_gateway_tunnel_handshakes_abandoned_total; SECURITY.md)"

// verifySourceAddress says whether a new client must prove its address
// with a Retry before its handshake starts: while the gate is crowded and
// a flood was seen. The address is unverified, so it plays no part in
// the decision. quic-go asks for every Initial without a token.
func (s *Server) verifySourceAddress(net.Addr) bool {
	if !s.gate.crowded() || !s.flood.flooded(s.now()) {
		return false
	}
	s.retries.Inc()
	return true
}
