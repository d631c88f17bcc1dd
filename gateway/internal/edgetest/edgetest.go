// Package edgetest is a minimal tether-edge for the gateway's tests: a real
// QUIC client that presents a node certificate, accepts the gateway's
// streams, checks each request against an allow function, dials, replies
// and relays. It is test support only; no production package imports it.
package edgetest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/tunnel"
)

// Options configure Dial.
type Options struct {
	// Cert is the edge's client certificate.
	Cert tls.Certificate
	// Roots verify the gateway's certificate for ServerName.
	Roots      *x509.CertPool
	ServerName string
	// Allow decides each request; nil allows everything. A code other than
	// tunnel.OK is sent back as the refusal.
	Allow func(tunnel.Request) tunnel.Code
	// Limits are passed to tunnel.QUICConfig.
	Limits tunnel.Limits
}

// Edge is a connected test edge.
type Edge struct {
	conn  *quic.Conn
	allow func(tunnel.Request) tunnel.Code
	wg    sync.WaitGroup

	mu   sync.Mutex
	reqs []tunnel.Request
}

// Dial connects to the gateway's tunnel listener at addr and starts serving
// streams. The error is the handshake's when the gateway refuses the
// certificate during the handshake.
func Dial(ctx context.Context, addr string, opts Options) (*Edge, error) {
	cert := opts.Cert
	tc := tunnel.ClientTLS(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil },
		opts.Roots, opts.ServerName)
	conn, err := quic.DialAddr(ctx, addr, tc, tunnel.QUICConfig(opts.Limits))
	if err != nil {
		return nil, fmt.Errorf("dial gateway %s: %w", addr, err)
	}
	e := &Edge{conn: conn, allow: opts.Allow}
	e.wg.Add(1)
	go e.serve()
	return e, nil
}

// Conn is the edge's QUIC connection; its Context ends, with the gateway's
// close error as cause, when the gateway closes it.
func (e *Edge) Conn() *quic.Conn { return e.conn }

// Requests returns the requests received so far.
func (e *Edge) Requests() []tunnel.Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]tunnel.Request(nil), e.reqs...)
}

// Close closes the connection and waits for the stream handlers.
func (e *Edge) Close() {
	e.conn.CloseWithError(tunnel.CloseNormal, "test edge closing")
	e.wg.Wait()
}

// CloseCode returns the application error code the gateway closed the
// connection with, once it is closed; ok is false if it is still open or
// was closed otherwise.
func (e *Edge) CloseCode() (code quic.ApplicationErrorCode, ok bool) {
	if e.conn.Context().Err() == nil {
		return 0, false
	}
	var ae *quic.ApplicationError
	if errors.As(context.Cause(e.conn.Context()), &ae) && ae.Remote {
		return ae.ErrorCode, true
	}
	return 0, false
}

// WaitClosed waits up to d for the gateway to close the connection and
// returns CloseCode.
func (e *Edge) WaitClosed(d time.Duration) (quic.ApplicationErrorCode, bool) {
	select {
	case <-e.conn.Context().Done():
	case <-time.After(d):
	}
	return e.CloseCode()
}

func (e *Edge) serve() {
	defer e.wg.Done()
	for {
		s, err := e.conn.AcceptStream(context.Background())
		if err != nil {
			return
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.handle(s)
		}()
	}
}

func (e *Edge) handle(s *quic.Stream) {
	req, err := tunnel.ReadRequest(s)
	if err != nil {
		tunnel.WriteReply(s, tunnel.Reply{Code: tunnel.BadRequest, Message: err.Error()})
		s.Close()
		s.CancelRead(0)
		return
	}
	e.mu.Lock()
	e.reqs = append(e.reqs, req)
	e.mu.Unlock()
	if e.allow != nil {
		if code := e.allow(req); code != tunnel.OK {
			tunnel.WriteReply(s, tunnel.Reply{Code: code, Message: "test edge refuses " + req.Dest.String()})
			s.Close()
			s.CancelRead(0)
			return
		}
	}
	c, err := net.DialTimeout("tcp", req.Dest.String(), 5*time.Second)
	if err != nil {
		tunnel.WriteReply(s, tunnel.Reply{Code: tunnel.DialFailed, Message: err.Error()})
		s.Close()
		s.CancelRead(0)
		return
	}
	if err := tunnel.WriteReply(s, tunnel.Reply{Code: tunnel.OK}); err != nil {
		c.Close()
		s.CancelRead(0)
		s.CancelWrite(0)
		return
	}
	tunnel.Relay(c.(*net.TCPConn), s, tunnel.RelayOptions{})
}

// AllowPorts returns an Allow function that accepts only the given ports.
func AllowPorts(ports ...uint16) func(tunnel.Request) tunnel.Code {
	return func(r tunnel.Request) tunnel.Code {
		for _, p := range ports {
			if r.Dest.Port() == p {
				return tunnel.OK
			}
		}
		return tunnel.NotAllowed
	}
}
