package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// bareQUIC is a reference for bulk throughput: quic-go with the tunnel's
// own TLS and QUIC settings, both ends in this process, no TCP and no
// relay. As in the tunnel, the gateway side (server) opens the stream and
// the edge side (client) sends.
type bareQUIC struct {
	gw, edge *quic.Conn
}

// newLoopbackQUIC is bare quic-go over loopback UDP, in a namespace of its
// own: the reference.
func newLoopbackQUIC(s *testenv.Session) (*bareQUIC, error) {
	h := testenv.NewHost(s, "barequic")
	return newBareQUIC(s, h, "127.0.0.1", h)
}

// newBareQUIC connects a client socket in client to a server socket on
// serverIP in server.
func newBareQUIC(s *testenv.Session, server *testenv.Host, serverIP string, client *testenv.Host) (*bareQUIC, error) {
	ca, err := testenv.NewCA("bare-quic-ca")
	if err != nil {
		return nil, err
	}
	srv, err := ca.ServerCert("gateway", serverIP)
	if err != nil {
		return nil, err
	}
	node, err := ca.NodeCert("bench-edge")
	if err != nil {
		return nil, err
	}
	spc, err := server.ListenPacket("udp", net.JoinHostPort(serverIP, "0"))
	if err != nil {
		return nil, err
	}
	cpc, err := client.ListenPacket("udp", ":0")
	if err != nil {
		spc.Close()
		return nil, err
	}
	str := &quic.Transport{Conn: spc}
	ctr := &quic.Transport{Conn: cpc}
	s.Cleanup(func() { ctr.Close(); str.Close() })

	ln, err := str.Listen(tunnel.ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &srv.TLS, nil }, ca.Pool()), tunnel.QUICConfig(tunnel.Limits{}))
	if err != nil {
		return nil, fmt.Errorf("bare quic-go: listen: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	accepted := make(chan *quic.Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		accepted <- c
	}()
	clientTLS := tunnel.ClientTLS(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &node.TLS, nil }, ca.Pool(), serverIP)
	edge, err := ctr.Dial(ctx, spc.LocalAddr(), clientTLS, tunnel.QUICConfig(tunnel.Limits{}))
	if err != nil {
		return nil, fmt.Errorf("bare quic-go: dial: %w", err)
	}
	gw := <-accepted
	if gw == nil {
		return nil, fmt.Errorf("bare quic-go: no connection accepted")
	}
	return &bareQUIC{gw: gw, edge: edge}, nil
}

// bulk moves n bytes from the edge side to the gateway side on a new
// stream and times it from the stream's opening to its end.
func (b *bareQUIC) bulk(ctx context.Context, n int64) (bulkResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	sent := make(chan error, 1)
	go func() {
		s, err := b.edge.AcceptStream(ctx)
		if err != nil {
			sent <- err
			return
		}
		var req [1]byte
		if _, err := io.ReadFull(s, req[:]); err != nil {
			sent <- err
			return
		}
		buf := make([]byte, 64<<10)
		world.Pattern{}.Read(buf)
		for left := n; left > 0; {
			k, err := s.Write(buf[:min(left, int64(len(buf)))])
			if err != nil {
				sent <- err
				return
			}
			left -= int64(k)
		}
		sent <- s.Close()
	}()

	start := time.Now()
	s, err := b.gw.OpenStreamSync(ctx)
	if err != nil {
		return bulkResult{}, err
	}
	defer s.CancelRead(0)
	if _, err := s.Write([]byte{1}); err != nil {
		return bulkResult{}, err
	}
	s.Close()
	got, err := drain(s)
	if err != nil {
		return bulkResult{}, fmt.Errorf("bare quic-go: after %d bytes: %w", got, err)
	}
	elapsed := time.Since(start)
	if err := <-sent; err != nil {
		return bulkResult{}, fmt.Errorf("bare quic-go: send: %w", err)
	}
	if got != n {
		return bulkResult{}, fmt.Errorf("bare quic-go: %d bytes, want %d", got, n)
	}
	return bulkResult{bytes: got, elapsed: elapsed}, nil
}

// bulkFor moves bytes from the edge side to the gateway side on a new
// stream for d, as fast as they go, and returns what arrived: the
// time-bounded transfer of the shaped scenarios.
func (b *bareQUIC) bulkFor(ctx context.Context, d time.Duration) (bulkResult, error) {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	go func() {
		s, err := b.edge.AcceptStream(ctx)
		if err != nil {
			return
		}
		var req [1]byte
		if _, err := io.ReadFull(s, req[:]); err != nil {
			return
		}
		buf := make([]byte, 64<<10)
		world.Pattern{}.Read(buf)
		for {
			if _, err := s.Write(buf); err != nil { // ends when the reader cancels
				return
			}
		}
	}()
	start := time.Now()
	s, err := b.gw.OpenStreamSync(ctx)
	if err != nil {
		return bulkResult{}, err
	}
	defer s.CancelRead(0)
	if _, err := s.Write([]byte{1}); err != nil {
		return bulkResult{}, err
	}
	s.Close()
	s.SetReadDeadline(start.Add(d))
	buf := make([]byte, 64<<10)
	var got int64
	for {
		n, err := s.Read(buf)
		got += int64(n)
		if err != nil {
			if time.Since(start) >= d {
				return bulkResult{bytes: got, elapsed: time.Since(start)}, nil
			}
			return bulkResult{}, fmt.Errorf("bare quic-go: after %d bytes: %w", got, err)
		}
	}
}
