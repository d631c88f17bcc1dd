package tunnel

import (
	"testing"

	"github.com/tether-edge/tether/internal/testenv"
)

// TestRelayLeavesNothing runs the relay tests whose connections end (a
// half close each way, a reset, the idle limit, a peer that stops
// reading) under a leak check: once their TCP connections, streams and
// QUIC connections have ended, so have the relays' goroutines and every
// socket they used.
func TestRelayLeavesNothing(t *testing.T) {
	testenv.CheckLeaks(t)
	t.Run("HalfClose", TestRelayHalfClose)
	t.Run("CountsBytes", TestRelayCountsBytes)
	t.Run("ResetPropagates", TestRelayResetPropagates)
	t.Run("IdleTimeout", TestRelayIdleTimeout)
	t.Run("PeerStopsReading", TestRelayPeerStopsReading)
}
