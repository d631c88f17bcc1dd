package edgetunnel

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/tunnel"
)

// DefaultMaxServiceStreams is the default of Options.MaxServiceStreams:
// the gateway's default --max-service-streams-per-edge.
const DefaultMaxServiceStreams = 256

// DialService asks a gateway replica to connect a pod of this node to a
// cloud Service marked for edge access (tunnel.ServiceRequest) and
// returns the stream the connection's bytes then flow on, for
// tunnel.Relay; the caller ends it with Release once the relay is over.
//
// Replicas are tried lowest RTT first. The next one is tried when a
// stream cannot be opened or answered, when this edge already has
// Options.MaxServiceStreams service streams open toward a replica (its
// own slots for heartbeats, elections and the pool feed stay free: the
// gateway admits tunnel.MaxStreamsToGateway of those beside the service
// streams), and when a replica refuses with Overloaded, Unavailable or
// RateLimited, which are that replica's own state. Any other refusal
// (NotMarked, NoEndpoints, DialFailed, BadRequest) is what every replica
// would answer, and is returned at once. A refusal is returned as a
// *tunnel.RefusedError (errors.As) with the gateway's code; with no
// replica connected the error wraps ErrNoGateway. Opening the stream and
// reading the reply are bounded by Options.HeartbeatTimeout.
func (c *Client) DialService(ctx context.Context, req tunnel.ServiceRequest) (*ServiceStream, error) {
	raw, err := tunnel.AppendServiceRequest(nil, req)
	if err != nil {
		return nil, fmt.Errorf("service %s: %w", req, err)
	}
	rs := c.connected()
	if len(rs) == 0 {
		return nil, fmt.Errorf("service %s: %w", req, ErrNoGateway)
	}
	var last error
	for _, r := range rs {
		s, err := r.openService(ctx, raw)
		if err == nil {
			return s, nil
		}
		last = err
		var re *tunnel.RefusedError
		if ctx.Err() != nil || (errors.As(err, &re) && !retryService(re.Code)) {
			break
		}
		r.log.Debug("service stream not opened; trying another gateway replica", "service", req.String(), "err", err)
	}
	return nil, fmt.Errorf("service %s: %w", req, last)
}

// retryService reports whether another replica may accept a service
// stream this one refused with code: only when the refusal was this
// replica's own state (its load, its rate limit for this edge, its
// readiness).
func retryService(code tunnel.Code) bool {
	return retryElsewhere(code) || code == tunnel.RateLimited
}

// openService takes one of the replica's service slots, sends a service
// request (its wire form, req) on a new stream and reads the reply.
func (r *replica) openService(ctx context.Context, req []byte) (*ServiceStream, error) {
	gw := r.ep.addr.String()
	select {
	case r.serviceSlots <- struct{}{}:
	default:
		return nil, &tunnel.RefusedError{Code: tunnel.Overloaded,
			Message: fmt.Sprintf("this edge has %d service streams open toward gateway %s", cap(r.serviceSlots), gw)}
	}
	ss := &ServiceStream{Gateway: r.ep.addr, slots: r.serviceSlots}
	conn := r.current()
	if conn == nil {
		ss.Release()
		return nil, fmt.Errorf("gateway %s: %w", gw, ErrNoGateway)
	}
	octx, cancel := context.WithTimeout(ctx, r.c.opts.HeartbeatTimeout)
	defer cancel()
	s, err := conn.OpenStreamSync(octx)
	if err != nil {
		ss.Release()
		return nil, fmt.Errorf("gateway %s: open stream: %w", gw, err)
	}
	ss.s = s
	// Until the reply is read the attempt's bound ends the stream.
	stop := context.AfterFunc(octx, ss.cancel)
	if _, err := s.Write(req); err != nil {
		stop()
		ss.Release()
		return nil, fmt.Errorf("gateway %s: send request: %w", gw, attemptErr(octx, err))
	}
	_, err = tunnel.ReadReply(s)
	if !stop() {
		err = cmpErr(err, context.Cause(octx))
	}
	var re *tunnel.RefusedError
	switch {
	case errors.As(err, &re):
		ss.Release()
		return nil, re
	case err != nil:
		ss.Release()
		return nil, fmt.Errorf("gateway %s: %w", gw, attemptErr(octx, err))
	}
	s.SetReadDeadline(time.Time{})
	return ss, nil
}

// ServiceStream is an open connection to a cloud Service through a
// gateway replica: the bytes of the pod's connection flow on it both ways
// (tunnel.Stream). It holds one of the edge's service slots toward that
// replica until Release.
type ServiceStream struct {
	// Gateway is the replica's address.
	Gateway netip.AddrPort

	s     *quic.Stream
	slots chan struct{}
	once  sync.Once
}

var _ tunnel.Stream = (*ServiceStream)(nil)

func (s *ServiceStream) Read(p []byte) (int, error)  { return s.s.Read(p) }
func (s *ServiceStream) Write(p []byte) (int, error) { return s.s.Write(p) }

// Close ends the write direction (a FIN to the Service); reading goes
// on.
func (s *ServiceStream) Close() error                       { return s.s.Close() }
func (s *ServiceStream) CancelRead(c quic.StreamErrorCode)  { s.s.CancelRead(c) }
func (s *ServiceStream) CancelWrite(c quic.StreamErrorCode) { s.s.CancelWrite(c) }

// Release ends whatever is left of the stream and frees its slot. It is
// safe to call more than once.
func (s *ServiceStream) Release() {
	s.once.Do(func() {
		if s.s != nil {
			s.cancel()
		}
		<-s.slots
	})
}

func (s *ServiceStream) cancel() {
	s.s.CancelRead(0)
	s.s.CancelWrite(0)
	s.s.SetReadDeadline(time.Now())
}
