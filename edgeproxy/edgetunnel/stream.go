package edgetunnel

import (
	"context"
	"errors"
	"net"
	"os"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/tunnel"
)

// handleStream serves one stream the gateway opened: read the request,
// check it, dial, reply, relay. Every refusal has its code, a debug log
// line and a count.
func (c *Client) handleStream(ctx context.Context, r *replica, s *quic.Stream) {
	r.streamsOpen.Add(1)
	defer r.streamsOpen.Add(-1)
	r.streamsTotal.Add(1)

	s.SetReadDeadline(time.Now().Add(c.opts.HeaderTimeout))
	req, err := tunnel.ReadRequest(s)
	if err != nil {
		if errors.Is(err, tunnel.ErrBadHeader) || errors.Is(err, os.ErrDeadlineExceeded) {
			c.refuse(r, s, req, tunnel.BadRequest, err.Error())
			return
		}
		// The stream or the connection went away before a request came.
		r.log.Debug("stream ended before its request", "err", err)
		s.CancelRead(0)
		s.CancelWrite(0)
		return
	}
	s.SetReadDeadline(time.Time{})

	if reason := c.allow.check(req.Dest); reason != "" {
		c.refuse(r, s, req, tunnel.NotAllowed, reason)
		return
	}
	select {
	case c.slots <- struct{}{}:
		defer func() { <-c.slots }()
	default:
		c.refuse(r, s, req, tunnel.Overloaded, "too many streams on this edge")
		return
	}

	dctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	conn, err := c.dialer.DialContext(dctx, "tcp", req.Dest.String())
	cancel()
	if err != nil {
		c.refuse(r, s, req, dialCode(err), err.Error())
		return
	}
	tc, ok := conn.(tunnel.Conn)
	if !ok { // not with net.Dialer and "tcp"
		conn.Close()
		c.refuse(r, s, req, tunnel.DialFailed, "dialled connection cannot half-close")
		return
	}
	if err := tunnel.WriteReply(s, tunnel.Reply{Code: tunnel.OK}); err != nil {
		r.log.Debug("write reply", "client", req.Client, "dest", req.Dest, "err", err)
		tc.Close()
		s.CancelRead(0)
		s.CancelWrite(0)
		return
	}
	c.metrics.result(tunnel.OK)
	err = tunnel.Relay(tc, s, tunnel.RelayOptions{Idle: c.opts.StreamIdle, ToStream: &r.bytesUp, FromStream: &r.bytesDown})
	r.log.Debug("stream done", "client", req.Client, "dest", req.Dest, "err", err)
}

// refuse answers a request with a refusal and ends the stream.
func (c *Client) refuse(r *replica, s *quic.Stream, req tunnel.Request, code tunnel.Code, msg string) {
	c.metrics.result(code)
	attrs := []any{"code", code, "reason", msg}
	if req.Dest.IsValid() {
		attrs = append(attrs, "client", req.Client, "dest", req.Dest)
	}
	r.log.Debug("stream refused", attrs...)
	if err := tunnel.WriteReply(s, tunnel.Reply{Code: code, Message: msg}); err != nil {
		r.log.Debug("write refusal", "err", err)
	}
	s.Close()       // FIN after the reply
	s.CancelRead(0) // whatever the gateway sent after its request is not wanted
}

// dialCode is the reply code for a failed dial.
func dialCode(err error) tunnel.Code {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return tunnel.Timeout
	}
	return tunnel.DialFailed
}

// Dialer dials the destinations; *net.Dialer is one.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

var _ Dialer = (*net.Dialer)(nil)
