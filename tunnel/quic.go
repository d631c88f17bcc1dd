package tunnel

import (
	"crypto"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlog"
)

// Connection close codes (QUIC application error codes).
const (
	CloseNormal     quic.ApplicationErrorCode = 0
	CloseReplaced   quic.ApplicationErrorCode = 0x10 // a newer registration of the same node won
	CloseShutdown   quic.ApplicationErrorCode = 0x11 // the peer is shutting down
	CloseNotAllowed quic.ApplicationErrorCode = 0x12 // the identity was refused after the handshake
)

// Receive windows, chosen from BenchmarkBulkWindow (see the package doc,
// Receive windows): a stream's starts at 512 KiB and auto-tuning may grow
// it to 4 MiB, enough for 50 MB/s (400 Mbit/s) on a path of 80 ms round
// trip; a connection's starts at 768 KiB and may grow to 8 MiB, room for
// two such streams at once (quic-go grows a connection's window to 1.5
// times its largest stream's).
const (
	InitialStreamReceiveWindow     = 512 << 10
	MaxStreamReceiveWindow         = 4 << 20
	InitialConnectionReceiveWindow = 768 << 10
	MaxConnectionReceiveWindow     = 8 << 20
	// DefaultReceiveBudget is the gateway's default --max-receive-memory:
	// half of the gateway's memory limit in the shipped manifests
	// (512Mi).
	DefaultReceiveBudget = 256 << 20
)

// Limits bound what one peer may cost the other.
type Limits struct {
	// MaxStreams is the number of concurrent streams (proxied connections)
	// per edge. Default 1024.
	MaxStreams int64
	// IdleTimeout closes a connection that has been silent for this long;
	// the edge's keepalives are sent at half of it. Default 15 s.
	IdleTimeout time.Duration
	// ReceiveBudget, if set, bounds the growth of the receive windows of
	// all the connections made with this configuration together (the
	// gateway's --max-receive-memory); nil leaves each connection's
	// window free to grow to MaxConnectionReceiveWindow.
	ReceiveBudget *ReceiveBudget
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

// QUICConfig is the QUIC configuration both sides use (the gateway's with
// ListenerQUICConfig's change). The receive windows are the constants
// above; with l.ReceiveBudget their growth is bounded across connections
// too. The keepalive notices a dead path within IdleTimeout.
//
// The keepalive period is half the idle timeout, the longest quic-go
// allows: a lost PING is sent again after a PTO, tens of milliseconds on
// a WAN, so the idle timeout still closes only a dead path, and a NAT
// mapping (RFC 4787 asks for at least two minutes; 30 s is common) is
// refreshed every 7.5 s. A third of it cost each edge a third more
// packets and bytes for nothing, on links that are often metered; at
// 10,000 idle edges on one 2-core gateway, once their RTT estimates had
// settled, 4,085 datagrams/s and 25.0 to 25.1 % of a core against about
// 2,670 and 20.5 to 24.5 % (make bench-scale, two runs each). What it costs: a gateway restarted on the
// same address is noticed by an idle edge's liveness probe about 11 s
// after its last packet instead of 7.5, or at the idle timeout (all of
// 10,000 back 40 s after a restart, 26 s before).
func QUICConfig(l Limits) *quic.Config {
	l = l.withDefaults()
	cfg := &quic.Config{
		HandshakeIdleTimeout:           5 * time.Second,
		MaxIdleTimeout:                 l.IdleTimeout,
		KeepAlivePeriod:                l.IdleTimeout / 2,
		MaxIncomingStreams:             l.MaxStreams,
		MaxIncomingUniStreams:          -1,
		InitialStreamReceiveWindow:     InitialStreamReceiveWindow,
		MaxStreamReceiveWindow:         MaxStreamReceiveWindow,
		InitialConnectionReceiveWindow: InitialConnectionReceiveWindow,
		MaxConnectionReceiveWindow:     MaxConnectionReceiveWindow,
	}
	if l.ReceiveBudget != nil {
		cfg.AllowConnectionWindowIncrease = l.ReceiveBudget.Allow
	}
	if os.Getenv("QLOGDIR") != "" {
		// quic-go's qlog, one file per connection in $QLOGDIR: the
		// congestion window, losses and flow control of each tunnel, for
		// debugging only (a busy tunnel writes megabytes a second).
		cfg.Tracer = qlog.DefaultConnectionTracer
	}
	return cfg
}

// ListenerQUICConfig is QUICConfig for the gateway's listener: without
// keepalives. The edge keeps the path and its NAT mapping alive with its
// PINGs, and the gateway's ACKs are what the edge hears; the gateway's
// idle timeout still closes a tunnel whose edge went silent. When both
// sides sent keepalives, each side's timer ran from its last packet
// received, about an ACK delay (25 ms) apart: a gateway whose timers ran
// late under load often fired in the same instant as the edge, and each
// such race cost two more packets (10,000 idle edges: 2,430 datagrams/s
// each way where one PING and one ACK per edge per keepalive period make
// 2,000).
func ListenerQUICConfig(l Limits) *quic.Config {
	cfg := QUICConfig(l)
	cfg.KeepAlivePeriod = 0
	return cfg
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
