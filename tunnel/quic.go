package tunnel

import (
	"crypto"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/quic-go/quic-go"
)

// Connection close codes (QUIC application error codes).
const (
	CloseNormal     quic.ApplicationErrorCode = 0
	CloseReplaced   quic.ApplicationErrorCode = 0x10 // a newer registration of the same node won
	CloseShutdown   quic.ApplicationErrorCode = 0x11 // the peer is shutting down
	CloseNotAllowed quic.ApplicationErrorCode = 0x12 // the identity was refused after the handshake
)

// Limits bound what one peer may cost the other.
type Limits struct {
	// MaxStreams is the number of concurrent streams (proxied connections)
	// per edge. Default 1024.
	MaxStreams int64
	// IdleTimeout closes a connection that has been silent for this long;
	// keepalives are sent at a third of it. Default 15 s.
	IdleTimeout time.Duration
}

func (l Limits) withDefaults() Limits {
	if l.MaxStreams <= 0 {
		l.MaxStreams = 1024
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = 15 * time.Second
	}
	return l
}

// QUICConfig is the QUIC configuration both sides use. The receive windows
// are large enough for one stream to fill a fast link (the default 6 MB
// per stream caps a single transfer on long paths), and the keepalive
// notices a dead path within IdleTimeout.
func QUICConfig(l Limits) *quic.Config {
	l = l.withDefaults()
	return &quic.Config{
		HandshakeIdleTimeout:           5 * time.Second,
		MaxIdleTimeout:                 l.IdleTimeout,
		KeepAlivePeriod:                l.IdleTimeout / 3,
		MaxIncomingStreams:             l.MaxStreams,
		MaxIncomingUniStreams:          -1,
		InitialStreamReceiveWindow:     1 << 20,
		MaxStreamReceiveWindow:         16 << 20,
		InitialConnectionReceiveWindow: 4 << 20,
		MaxConnectionReceiveWindow:     64 << 20,
	}
}

// StatelessResetKey derives the key of QUIC stateless resets from the
// gateway's private key, so that it survives a restart: a gateway that
// comes back on the same address can then tell edges at once that their
// old connections are gone, instead of leaving them to the idle timeout.
// Replicas sharing one serving key share the reset key, as RFC 9000
// (section 10.3) suggests for a cluster.
func StatelessResetKey(key crypto.PrivateKey) (*quic.StatelessResetKey, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("derive stateless reset key: %w", err)
	}
	mac := hmac.New(sha256.New, []byte("tether/1 stateless reset"))
	mac.Write(der)
	var k quic.StatelessResetKey
	copy(k[:], mac.Sum(nil))
	return &k, nil
}
