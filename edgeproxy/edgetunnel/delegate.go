package edgetunnel

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/tunnel"
)

// ErrNoGateway is returned (wrapped) by DelegateHeartbeat and
// WriteElectionRecord when no gateway replica is connected.
var ErrNoGateway = errors.New("not connected to any gateway")

// DelegateRefusedError is a gateway's refusal of a delegated heartbeat.
type DelegateRefusedError struct {
	Gateway string // the replica's address
	Node    string // the delegated node
	// Code says why: tunnel.NotLeader, LeaderExpired, NotInPool,
	// OtherPool, UnknownNode, BadLease, Unavailable or BadRequest.
	Code    tunnel.Code
	Message string // the gateway's detail
}

func (e *DelegateRefusedError) Error() string {
	s := fmt.Sprintf("gateway %s refused the heartbeat of %s: %s", e.Gateway, e.Node, e.Code)
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// retryElsewhere reports whether another replica may accept what this one
// refused with code: only when the refusal was this replica's own trouble.
// The other refusals depend on the cluster's objects, which every replica
// reads alike.
func retryElsewhere(code tunnel.Code) bool {
	return code == tunnel.Unavailable || code == tunnel.Overloaded
}

// DelegateHeartbeat asks a gateway to write lease, the coordination.k8s.io
// Lease (JSON) of node, a node of this node's pool that lost the cloud.
// The gateway writes it only while this node holds its pool's election
// record (poolstore) and both nodes are in that pool.
//
// It opens a stream on the connected replica with the lowest RTT and, if
// the stream fails or that replica cannot serve (tunnel.Unavailable), on
// the next one; each attempt is bounded by Options.HeartbeatTimeout. A
// refusal is returned as a *DelegateRefusedError (errors.As); with no
// replica connected the error wraps ErrNoGateway.
func (c *Client) DelegateHeartbeat(ctx context.Context, node string, lease []byte) error {
	req, err := tunnel.AppendDelegateRequest(nil, tunnel.DelegateRequest{Node: node, Lease: lease})
	if err != nil {
		return fmt.Errorf("delegate heartbeat of %s: %w", node, err)
	}
	err = c.eachGateway(ctx, func(r *replica) error {
		err := r.delegate(ctx, node, req)
		c.metrics.heartbeat(err)
		if err == nil {
			r.log.Debug("heartbeat delegated", "node", node)
		}
		return err
	}, func(r *replica, err error) {
		r.log.Debug("heartbeat not delegated; trying another gateway replica", "node", node, "err", err)
	})
	if err != nil {
		return fmt.Errorf("delegate heartbeat of %s: %w", node, err)
	}
	return nil
}

// eachGateway runs try on the connected replicas, lowest RTT first, until
// one succeeds, a refusal that another replica would repeat comes back
// (see retryElsewhere), or ctx ends; next is told of each failure that
// leads to the next replica. With no replica connected it returns
// ErrNoGateway, else the errors of the tries.
func (c *Client) eachGateway(ctx context.Context, try func(*replica) error, next func(*replica, error)) error {
	rs := c.connected()
	if len(rs) == 0 {
		return ErrNoGateway
	}
	var errs []error
	for _, r := range rs {
		err := try(r)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
		if code, refused := refusalCode(err); ctx.Err() != nil || (refused && !retryElsewhere(code)) {
			break
		}
		next(r, err)
	}
	return errors.Join(errs...)
}

// refusalCode is the code of a gateway's refusal, if err is one.
func refusalCode(err error) (tunnel.Code, bool) {
	var dr *DelegateRefusedError
	var er *ElectionRefusedError
	switch {
	case errors.As(err, &dr):
		return dr.Code, true
	case errors.As(err, &er):
		return er.Code, true
	}
	return 0, false
}

// connected returns the replicas that have a connection, lowest RTT first.
func (c *Client) connected() []*replica {
	type up struct {
		r   *replica
		rtt int64
	}
	var ups []up
	c.mu.Lock()
	for _, r := range c.replicas {
		if conn := r.current(); conn != nil {
			ups = append(ups, up{r, int64(conn.ConnectionStats().SmoothedRTT)})
		}
	}
	c.mu.Unlock()
	slices.SortFunc(ups, func(a, b up) int {
		return cmp.Or(cmp.Compare(a.rtt, b.rtt), a.r.ep.addr.Compare(b.r.ep.addr))
	})
	out := make([]*replica, len(ups))
	for i, u := range ups {
		out[i] = u.r
	}
	return out
}

// current is the replica's connection, nil while disconnected.
func (r *replica) current() *quic.Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conn
}

// delegate sends one delegate-heartbeat request (its wire form, req) on a
// new stream to the replica and reads the reply.
func (r *replica) delegate(ctx context.Context, node string, req []byte) error {
	err := r.roundTrip(ctx, req, func(rd io.Reader) error {
		_, err := tunnel.ReadReply(rd)
		return err
	})
	var re *tunnel.RefusedError
	if errors.As(err, &re) {
		return &DelegateRefusedError{Gateway: r.ep.addr.String(), Node: node, Code: re.Code, Message: re.Message}
	}
	return err
}

// roundTrip sends req, the wire form of a request, on a new stream to the
// replica and reads the reply with read, within Options.HeartbeatTimeout.
// A refusal is returned as the *tunnel.RefusedError read returned; other
// errors name the replica.
func (r *replica) roundTrip(ctx context.Context, req []byte, read func(io.Reader) error) error {
	gw := r.ep.addr.String()
	conn := r.current()
	if conn == nil {
		return fmt.Errorf("gateway %s: %w", gw, ErrNoGateway)
	}
	ctx, cancel := context.WithTimeout(ctx, r.c.opts.HeartbeatTimeout)
	defer cancel()
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return fmt.Errorf("gateway %s: open stream: %w", gw, err)
	}
	// The attempt's end, by timeout or by the caller, unblocks the stream.
	stop := context.AfterFunc(ctx, func() {
		s.CancelWrite(0)
		s.CancelRead(0)
	})
	defer stop()
	if _, err := s.Write(req); err != nil {
		return fmt.Errorf("gateway %s: send request: %w", gw, attemptErr(ctx, err))
	}
	s.Close() // nothing follows the request
	err = read(s)
	s.CancelRead(0) // nothing follows the reply either
	var re *tunnel.RefusedError
	switch {
	case errors.As(err, &re):
		return re
	case err != nil:
		return fmt.Errorf("gateway %s: %w", gw, attemptErr(ctx, err))
	}
	return nil
}

// attemptErr is err, or the reason the attempt's context ended when it
// did: a stream cancelled by its end fails with a less telling error.
func attemptErr(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil {
		return cause
	}
	return err
}
