package edgetunnel

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/tunnel"
)

// PoolFeedRefusedError is a gateway's refusal of a pool feed.
type PoolFeedRefusedError struct {
	Gateway string // the replica's address
	Pool    string
	// Code says why: tunnel.NotLeader, LeaderExpired, NotInPool,
	// OtherPool, UnknownNode, Unavailable, RateLimited or BadRequest (a
	// gateway that serves no pool feed).
	Code    tunnel.Code
	Message string // the gateway's detail
}

func (e *PoolFeedRefusedError) Error() string {
	s := fmt.Sprintf("gateway %s refused pool %s's feed: %s", e.Gateway, e.Pool, e.Code)
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// PoolFeed asks a gateway replica for pool's signed feed (package
// poolstore/feed), which the gateway serves only to the pool's current
// leader, and returns the stream it flows on: the caller reads it with
// feed.NewReader and verifies it (GatewayNames, Options.RootCAs). The
// stream ends when the gateway ends it (the sender no longer leads, the
// tunnel closed), when ctx ends, or on Close.
//
// Replicas are tried lowest RTT first, the next one when a stream fails
// or a replica refuses; opening the stream and reading the reply are
// bounded by Options.HeartbeatTimeout. The last refusal is returned as a
// *PoolFeedRefusedError (errors.As); with no replica connected the error
// wraps ErrNoGateway. The feed holds one of the streams the edge may open
// toward that replica (tunnel.MaxStreamsToGateway) while it lasts.
func (c *Client) PoolFeed(ctx context.Context, pool string) (io.ReadCloser, error) {
	raw, err := tunnel.AppendPoolFeedRequest(nil, tunnel.PoolFeedRequest{Pool: pool})
	if err != nil {
		return nil, fmt.Errorf("pool %s's feed: %w", pool, err)
	}
	rs := c.connected()
	if len(rs) == 0 {
		return nil, fmt.Errorf("pool %s's feed: %w", pool, ErrNoGateway)
	}
	var errs []error
	for _, r := range rs {
		s, err := r.openFeed(ctx, pool, raw)
		if err == nil {
			r.log.Debug("pool feed opened", "pool", pool)
			return s, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
		r.log.Debug("pool feed not opened; trying another gateway replica", "pool", pool, "err", err)
	}
	return nil, fmt.Errorf("pool %s's feed: %w", pool, errors.Join(errs...))
}

// openFeed sends a pool feed request (its wire form, req) on a new stream
// to the replica and reads the reply.
func (r *replica) openFeed(ctx context.Context, pool string, req []byte) (io.ReadCloser, error) {
	gw := r.ep.addr.String()
	conn := r.current()
	if conn == nil {
		return nil, fmt.Errorf("gateway %s: %w", gw, ErrNoGateway)
	}
	octx, cancel := context.WithTimeout(ctx, r.c.opts.HeartbeatTimeout)
	defer cancel()
	s, err := conn.OpenStreamSync(octx)
	if err != nil {
		return nil, fmt.Errorf("gateway %s: open stream: %w", gw, err)
	}
	fs := &feedStream{s: s}
	// Until the reply is read the attempt's bound ends the stream; then
	// the caller's ctx does.
	stop := context.AfterFunc(octx, fs.cancel)
	if _, err := s.Write(req); err != nil {
		stop()
		fs.cancel()
		return nil, fmt.Errorf("gateway %s: send request: %w", gw, attemptErr(octx, err))
	}
	s.Close() // nothing follows the request
	_, err = tunnel.ReadReply(s)
	if !stop() {
		err = cmpErr(err, context.Cause(octx))
	}
	var re *tunnel.RefusedError
	switch {
	case errors.As(err, &re):
		fs.cancel()
		return nil, &PoolFeedRefusedError{Gateway: gw, Pool: pool, Code: re.Code, Message: re.Message}
	case err != nil:
		fs.cancel()
		return nil, fmt.Errorf("gateway %s: %w", gw, attemptErr(octx, err))
	}
	fs.stop = context.AfterFunc(ctx, fs.cancel)
	return fs, nil
}

// cmpErr is err, or alt when err is nil.
func cmpErr(err, alt error) error {
	if err != nil {
		return err
	}
	return alt
}

// feedStream is a pool feed's stream: Read reads the feed, Close ends it.
type feedStream struct {
	s    *quic.Stream
	stop func() bool // stops ending it with the caller's ctx
	once sync.Once
}

func (f *feedStream) Read(p []byte) (int, error) { return f.s.Read(p) }

// Close ends the stream: the gateway sees the edge stop reading.
func (f *feedStream) Close() error {
	if f.stop != nil {
		f.stop()
	}
	f.cancel()
	return nil
}

func (f *feedStream) cancel() {
	f.once.Do(func() {
		f.s.CancelRead(0)
		f.s.CancelWrite(0)
		f.s.SetReadDeadline(time.Now())
	})
}

// GatewayNames are the names the gateways' certificates are verified
// for: Options.ServerName, or else the --gateway entries' hosts.
func (c *Client) GatewayNames() []string {
	if c.opts.ServerName != "" {
		return []string{c.opts.ServerName}
	}
	var names []string
	for _, t := range c.targets {
		if !slices.Contains(names, t.Host) {
			names = append(names, t.Host)
		}
	}
	return names
}

// RootCAs returns Options.RootCAs, the roots the gateways' certificates
// chain to (nil: the system's).
func (c *Client) RootCAs() func() *x509.CertPool { return c.opts.RootCAs }
