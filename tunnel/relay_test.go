package tunnel

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/internal/testenv"
)

// quicPair connects a gateway-side and an edge-side QUIC connection over
// real UDP on loopback, with the package's own TLS and QUIC settings.
func quicPair(t *testing.T) (gw, edge *quic.Conn) {
	t.Helper()
	ca := testenv.MustCA(t, "tunnel-test-ca")
	srv, err := ca.ServerCert("gateway", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	node, err := ca.NodeCert("edge-1")
	if err != nil {
		t.Fatal(err)
	}
	serverTLS := ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &srv.TLS, nil }, ca.Pool())
	ln, err := quic.ListenAddr("127.0.0.1:0", serverTLS, QUICConfig(Limits{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	accepted := make(chan *quic.Conn, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			t.Errorf("accept: %v", err)
		}
		accepted <- c
	}()
	clientTLS := ClientTLS(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &node.TLS, nil }, ca.Pool(), "127.0.0.1")
	edge, err = quic.DialAddr(ctx, ln.Addr().String(), clientTLS, QUICConfig(Limits{}))
	if err != nil {
		t.Fatal(err)
	}
	gw = <-accepted
	if gw == nil {
		t.FailNow()
	}
	t.Cleanup(func() {
		edge.CloseWithError(CloseNormal, "")
		gw.CloseWithError(CloseNormal, "")
	})
	peer := gw.ConnectionState().TLS.PeerCertificates
	if name, err := NodeName(peer[0]); err != nil || name != "edge-1" {
		t.Fatalf("NodeName of the verified peer = %q, %v", name, err)
	}
	return gw, edge
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t testing.TB) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// relayed builds client <-TCP-> [Relay] <-QUIC stream-> [Relay] <-TCP-> server,
// the path of one proxied connection, and returns the outer TCP ends and
// the two relays' results.
func relayed(t *testing.T, gwOpts, edgeOpts RelayOptions) (client, server *net.TCPConn, gwDone, edgeDone <-chan error) {
	t.Helper()
	gw, edge := quicPair(t)
	client, gwSide := tcpPair(t)
	edgeSide, server := tcpPair(t)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gs, err := gw.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A stream is announced to the peer with its first bytes.
	if _, err := gs.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	es, err := edge.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(es, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	g, e := make(chan error, 1), make(chan error, 1)
	go func() { g <- Relay(gwSide, gs, gwOpts) }()
	go func() { e <- Relay(edgeSide, es, edgeOpts) }()
	return client, server, g, e
}

func waitErr(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return", what)
		return nil
	}
}

func TestRelayHalfClose(t *testing.T) {
	client, server, gwDone, edgeDone := relayed(t, RelayOptions{}, RelayOptions{})

	// The client sends its request and closes its sending side; the server
	// must see EOF and still be able to answer.
	req := bytes.Repeat([]byte("request "), 100_000)
	if _, err := client.Write(req); err != nil {
		t.Fatal(err)
	}
	client.CloseWrite()
	got, err := io.ReadAll(server)
	if err != nil {
		t.Fatalf("server read: %v", err)
	}
	if !bytes.Equal(got, req) {
		t.Fatalf("server got %d bytes, want %d", len(got), len(req))
	}
	if _, err := server.Write([]byte("response")); err != nil {
		t.Fatalf("server write after client half-close: %v", err)
	}
	server.CloseWrite()
	resp, err := io.ReadAll(client)
	if err != nil || string(resp) != "response" {
		t.Fatalf("client read %q, %v", resp, err)
	}
	if err := waitErr(t, gwDone, "gateway relay"); err != nil {
		t.Errorf("gateway relay: %v", err)
	}
	if err := waitErr(t, edgeDone, "edge relay"); err != nil {
		t.Errorf("edge relay: %v", err)
	}
}

func TestRelayCountsBytes(t *testing.T) {
	var up, down atomicCounter
	client, server, gwDone, _ := relayed(t, RelayOptions{ToStream: &up.Int64, FromStream: &down.Int64}, RelayOptions{})
	client.Write(make([]byte, 1000))
	client.CloseWrite()
	io.Copy(io.Discard, server)
	server.Write(make([]byte, 300))
	server.Close()
	io.Copy(io.Discard, client)
	waitErr(t, gwDone, "gateway relay")
	if up.Load() != 1000 || down.Load() != 300 {
		t.Errorf("counted up %d down %d, want 1000 and 300", up.Load(), down.Load())
	}
}

func TestRelayResetPropagates(t *testing.T) {
	client, server, gwDone, edgeDone := relayed(t, RelayOptions{}, RelayOptions{})
	client.Write([]byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(server, buf); err != nil {
		t.Fatal(err)
	}
	server.SetLinger(0)
	server.Close() // RST

	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.ReadAll(client)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("client connection still open 5 s after the server reset")
	}
	if e := waitErr(t, edgeDone, "edge relay"); e == nil {
		t.Error("edge relay returned no error after a reset")
	}
	if e := waitErr(t, gwDone, "gateway relay"); e == nil {
		t.Error("gateway relay returned no error after the stream was aborted")
	}
}

func TestRelayIdleTimeout(t *testing.T) {
	client, _, gwDone, _ := relayed(t, RelayOptions{Idle: 200 * time.Millisecond}, RelayOptions{})
	start := time.Now()
	if err := waitErr(t, gwDone, "gateway relay"); !errors.Is(err, ErrIdle) {
		t.Fatalf("relay error = %v, want ErrIdle", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("relay gave up after %v, before its idle limit", d)
	}
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := client.Read(make([]byte, 1)); err == nil {
		t.Error("client connection still readable after idle abort")
	}
}

func TestRelayActiveConnectionIsNotIdle(t *testing.T) {
	client, server, gwDone, _ := relayed(t, RelayOptions{Idle: 300 * time.Millisecond}, RelayOptions{Idle: 300 * time.Millisecond})
	// One direction only (like `kubectl logs -f`): the other direction's
	// silence must not count as idle.
	for i := 0; i < 8; i++ {
		if _, err := server.Write([]byte("log line\n")); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		buf := make([]byte, 9)
		if _, err := io.ReadFull(client, buf); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		time.Sleep(100 * time.Millisecond) // the trickle's pace, not a wait: 8 gaps outlast Idle
	}
	select {
	case err := <-gwDone:
		t.Fatalf("relay ended while data flowed: %v", err)
	default:
	}
}

func TestRelayStalledReaderDoesNotBlockOtherStreams(t *testing.T) {
	// Two connections over the same QUIC connection: the first's reader
	// stops reading; the second must still move data.
	gw, edge := quicPair(t)
	type path struct {
		client, server *net.TCPConn
		sent, relayed  *atomic.Int64 // onto the edge's stream, off the gateway's
	}
	mk := func() path {
		client, gwSide := tcpPair(t)
		edgeSide, server := tcpPair(t)
		gs, err := gw.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		gs.Write([]byte{0})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		es, err := edge.AcceptStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadFull(es, make([]byte, 1))
		p := path{client, server, new(atomic.Int64), new(atomic.Int64)}
		go Relay(gwSide, gs, RelayOptions{FromStream: p.relayed})
		go Relay(edgeSide, es, RelayOptions{ToStream: p.sent})
		return p
	}
	stalled, live := mk(), mk()

	// Fill the stalled path: server writes, client never reads.
	go func() {
		chunk := make([]byte, 64<<10)
		for i := 0; i < 2000; i++ { // bounded: at most 128 MiB
			if _, err := stalled.server.Write(chunk); err != nil {
				return
			}
		}
	}()
	// The stalled path is full once its counters stand still while a
	// byte crosses the live path, over the same QUIC connection.
	live.client.SetReadDeadline(time.Now().Add(10 * time.Second))
	testenv.Eventually(t, "the stalled path full", func() bool {
		sent, relayed := stalled.sent.Load(), stalled.relayed.Load()
		live.server.Write([]byte{1})
		if _, err := io.ReadFull(live.client, make([]byte, 1)); err != nil {
			t.Fatalf("live connection while the other fills: %v", err)
		}
		return sent > 0 && stalled.sent.Load() == sent && stalled.relayed.Load() == relayed
	})

	want := bytes.Repeat([]byte("x"), 4<<20)
	go func() { live.server.Write(want); live.server.CloseWrite() }()
	live.client.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(live.client)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("live connection got %d of %d bytes, err %v", len(got), len(want), err)
	}
}

type atomicCounter struct{ atomic.Int64 }

// An edge that answers and stops reading (a refusal: its reply, FIN, then
// STOP_SENDING with code 0) while the client is still sending: the client
// gets the whole answer and then the end, not a reset that loses it.
func TestRelayPeerStopsReading(t *testing.T) {
	gw, edge := quicPair(t)
	client, gwSide := tcpPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gs, err := gw.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Relay(gwSide, gs, RelayOptions{}) }()
	// The client keeps sending: the relay's writes meet the STOP_SENDING.
	stopWriting := make(chan struct{})
	go func() {
		chunk := make([]byte, 32<<10)
		for {
			select {
			case <-stopWriting:
				return
			default:
			}
			if _, err := client.Write(chunk); err != nil {
				return
			}
		}
	}()
	defer close(stopWriting)
	es, err := edge.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(es, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := es.Write([]byte("refused: not allowed")); err != nil {
		t.Fatal(err)
	}
	es.Close()       // FIN after the answer
	es.CancelRead(0) // STOP_SENDING 0: nothing more wanted
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(client)
	if err != nil || string(got) != "refused: not allowed" {
		t.Fatalf("client read %q, %v; want the whole answer, then EOF", got, err)
	}
	if err := waitErr(t, done, "gateway relay"); err != nil {
		t.Errorf("relay: %v", err)
	}
}

// TestRelayLargeBuffers checks the relay's buffers: a burst makes both
// relays take large buffers, the bytes arrive intact, a trickle gives
// the large buffers back while the connection stays open, and nothing is
// held once it ends.
func TestRelayLargeBuffers(t *testing.T) {
	noLargeBuffers(t)
	client, server, gwDone, edgeDone := relayed(t, RelayOptions{}, RelayOptions{})

	// A download of 16 MiB that the client does not read at first: the
	// path fills up, so that the relays' reads fill their buffers.
	data := make([]byte, 16<<20)
	for i := range data {
		data[i] = byte(i * 7 / 3)
	}
	sent := make(chan error, 1)
	go func() {
		_, err := server.Write(data)
		sent <- err
	}()
	testenv.Eventually(t, "a large buffer in use", func() bool { return largeInUse.Load() > 0 })
	got := make([]byte, len(data))
	if _, err := io.ReadFull(client, got); err != nil {
		t.Fatalf("client read: %v", err)
	}
	if err := <-sent; err != nil {
		t.Fatalf("server write: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the client got other bytes than the server sent")
	}

	// Small exchanges: the relays go back to small buffers.
	for i := range 3 {
		msg := []byte(fmt.Sprintf("ping %d", i))
		if _, err := client.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(server, make([]byte, len(msg))); err != nil {
			t.Fatal(err)
		}
		if _, err := server.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(client, make([]byte, len(msg))); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, "no large buffer in use on the idle connection", func() bool { return largeInUse.Load() == 0 })

	client.CloseWrite()
	server.CloseWrite()
	io.Copy(io.Discard, client)
	io.Copy(io.Discard, server)
	if err := waitErr(t, gwDone, "gateway relay"); err != nil {
		t.Errorf("gateway relay: %v", err)
	}
	if err := waitErr(t, edgeDone, "edge relay"); err != nil {
		t.Errorf("edge relay: %v", err)
	}
	if n := largeInUse.Load(); n != 0 {
		t.Errorf("%d large buffers in use after the relays ended", n)
	}
}

// TestRelayLargeBufferBound checks that no more than maxLarge large
// buffers are in use at once, and that a buffer refused one stays usable.
func TestRelayLargeBufferBound(t *testing.T) {
	noLargeBuffers(t)
	bufs := make([]relayBuf, maxLarge+1)
	for i := range bufs {
		bufs[i] = newRelayBuf()
		bufs[i].adapt(smallBuf) // a read filled it
	}
	for i, b := range bufs {
		want := i < maxLarge
		if b.large != want || (len(*b.p) == largeBuf) != want {
			t.Errorf("buffer %d: large %v, %d bytes; want large %v", i, b.large, len(*b.p), want)
		}
	}
	if n := largeInUse.Load(); n != maxLarge {
		t.Errorf("%d large buffers in use, want %d", n, maxLarge)
	}
	bufs[0].adapt(smallBuf / 32) // a short read
	if bufs[0].large || len(*bufs[0].p) != smallBuf {
		t.Errorf("after a short read: large %v, %d bytes", bufs[0].large, len(*bufs[0].p))
	}
	for i := range bufs {
		bufs[i].release()
	}
	if n := largeInUse.Load(); n != 0 {
		t.Errorf("%d large buffers in use after all were released", n)
	}
}

// noLargeBuffers waits until the relays of earlier tests, which end
// after their connections were closed, have given their large buffers
// back.
func noLargeBuffers(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, "no large buffer in use before the test", func() bool { return largeInUse.Load() == 0 })
}
