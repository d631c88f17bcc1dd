package edgetunnel

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/tunnel"
)

// Liveness probes (see the tunnel package doc): a gateway replica that
// restarted answers the keepalive PINGs of the connections it forgot with
// nothing, because they are too short to be answered with a stateless
// reset. The watcher of each connection therefore looks about every
// quarter keepalive period (jittered by a quarter either way, so that
// edges that connected together do not probe in step) at how many
// packets it has received; once nothing has come for a keepalive period
// and a half (the PING sent after a keepalive period of silence went
// unanswered), it sends a probe padded to well over the 42 bytes that
// draw a stateless reset, and again at every look while the silence
// lasts. The half is margin for the looks: the silence is known to a
// look, up to a look late, and a healthy link is silent for up to a
// keepalive period and a round trip. With a quarter, a healthy edge
// probed about every other keepalive period: at 10,000 edges a third
// more packets through the gateway and 2.4 points of a core. A restarted
// gateway resets the connection at once and the supervisor dials again
// (after its jittered backoff); a live one answers, which ends the
// silence. At most one probe is out at a time, and each gives up after a
// quarter keepalive period.
//
// quic-go waits one and a half PTOs before its PING when that is longer
// than the keepalive period. An edge that connected while the gateway was
// overloaded carries an RTT estimate of seconds from its handshake, which
// one sample per keepalive period takes minutes to forget (10,000 edges
// after a cold start: 300 to 400 probes/s in the first minute, 14 after
// three). Those probes are not wasted: with the keepalive at half the idle
// timeout, a PING stretched that far would reach the gateway after its
// idle timeout, which runs on the gateway's own RTT estimate, and the
// tunnel would close. The probe keeps it open until the estimate decays.

// watch probes conn while it is silent (see above), until ctx ends.
func (r *replica) watch(ctx context.Context, conn *quic.Conn) {
	keepalive := r.c.quicConf.KeepAlivePeriod
	if keepalive <= 0 {
		return
	}
	tick := keepalive / 4
	last, heard := conn.ConnectionStats().PacketsReceived, r.c.clock.Now()
	for {
		t := r.c.clock.NewTimer(tick*3/4 + rand.N(tick/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		if n := conn.ConnectionStats().PacketsReceived; n != last {
			last, heard = n, r.c.clock.Now()
			continue
		}
		if r.c.clock.Since(heard) < keepalive+2*tick {
			continue
		}
		r.probe(conn, tick)
	}
}

// probe sends one liveness probe on conn and waits up to wait for the
// answer. Any answer, OK or a refusal from a gateway that does not know
// probes, says the gateway still has the connection.
func (r *replica) probe(conn *quic.Conn, wait time.Duration) {
	s, err := conn.OpenStream()
	if err != nil {
		// No stream credit (a gateway that lets edges open none, or
		// every stream in use): the keepalive and idle timeout remain.
		r.log.Debug("cannot open a liveness probe stream", "err", err)
		return
	}
	r.probes.Add(1)
	s.SetDeadline(time.Now().Add(wait))
	err = tunnel.WriteProbeRequest(s)
	if err == nil {
		s.Close()
		_, err = tunnel.ReadReply(s)
	}
	var refused *tunnel.RefusedError
	if err == nil || errors.As(err, &refused) {
		r.log.Debug("gateway answered a liveness probe", "err", err)
		s.CancelRead(0)
		return
	}
	r.log.Debug("liveness probe unanswered", "err", err)
	s.CancelRead(0)
	s.CancelWrite(0)
}

// Why a connection that was up ended, counted by
// tether_edge_tunnel_gateway_disconnects_total.
const (
	endStatelessReset  = iota // the gateway no longer knew it (it restarted)
	endIdleTimeout            // nothing heard for the idle timeout
	endClosedByGateway        // the gateway closed it (shutdown, replaced, refused)
	endOther                  // anything else: a local error, the edge closed it
	numEnds
)

var endNames = [numEnds]string{"stateless_reset", "idle_timeout", "closed_by_gateway", "other"}

// endOf classifies why a connection ended.
func endOf(err error) int {
	var sr *quic.StatelessResetError
	var it *quic.IdleTimeoutError
	var ae *quic.ApplicationError
	var te *quic.TransportError
	switch {
	case errors.As(err, &sr):
		return endStatelessReset
	case errors.As(err, &it):
		return endIdleTimeout
	case errors.As(err, &ae) && ae.Remote, errors.As(err, &te) && te.Remote:
		return endClosedByGateway
	}
	return endOther
}

// Disconnects counts, by reason (stateless_reset, idle_timeout,
// closed_by_gateway, other), the connections to the current gateway
// replicas that were up and ended: what
// tether_edge_tunnel_gateway_disconnects_total says, summed over replicas.
func (c *Client) Disconnects() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, numEnds)
	for _, r := range c.replicas {
		for end := range numEnds {
			out[endNames[end]] += r.ends[end].Load()
		}
	}
	return out
}
