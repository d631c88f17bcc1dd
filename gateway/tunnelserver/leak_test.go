package tunnelserver

import (
	"testing"

	"github.com/tether-edge/tether/internal/testenv"
)

// TestServerLeavesNothing runs the server's tests under a leak check:
// once their edges have disconnected or been refused, their streams have
// ended and Serve has returned, so have the server's goroutines, and its
// UDP socket and the edges' are closed.
func TestServerLeavesNothing(t *testing.T) {
	testenv.CheckLeaks(t)
	for _, tc := range []struct {
		name string
		test func(*testing.T)
	}{
		{"AcceptsNodeCertificate", TestAcceptsNodeCertificate},
		{"RefusesNonNodeCertificate", TestRefusesNonNodeCertificate},
		{"RefusesCertificateFromAnotherCA", TestRefusesCertificateFromAnotherCA},
		{"ShutdownDrainsStreams", TestShutdownDrainsStreams},
		{"ShutdownGraceExpires", TestShutdownGraceExpires},
		{"DelegateHeartbeatStream", TestDelegateHeartbeatStream},
		{"DelegateHeartbeatBadRequest", TestDelegateHeartbeatBadRequest},
		{"DelegateHeartbeatStreamLimit", TestDelegateHeartbeatStreamLimit},
		{"HandshakeRefusals", TestHandshakeRefusals},
		{"ClientCARotation", TestClientCARotation},
		{"RecheckEvicts", TestRecheckEvicts},
	} {
		t.Run(tc.name, tc.test)
	}
}
