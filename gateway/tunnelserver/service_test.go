package tunnelserver

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/gateway/internal/edgetest"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// echoServices connects every request for Service "echo" to a TCP echo
// server, and refuses the others NotMarked.
type echoServices struct {
	addr string
	mu   sync.Mutex
	seen []string // senders
	done int
}

func (e *echoServices) Connect(ctx context.Context, sender string, req tunnel.ServiceRequest) (net.Conn, tunnel.Reply, func()) {
	e.mu.Lock()
	e.seen = append(e.seen, sender)
	e.mu.Unlock()
	if req.Name != "echo" {
		return nil, tunnel.Reply{Code: tunnel.NotMarked, Message: req.String() + " is not marked"}, nil
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", e.addr)
	if err != nil {
		return nil, tunnel.Reply{Code: tunnel.DialFailed, Message: err.Error()}, nil
	}
	return c, tunnel.Reply{Code: tunnel.OK}, func() { e.mu.Lock(); e.done++; e.mu.Unlock() }
}

// openService opens a service stream on the edge's connection and reads
// the reply.
func openService(t *testing.T, edge *edgetest.Edge, name string) (*quic.Stream, *bufio.Reader, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := edge.Conn().OpenStreamSync(ctx)
	if err != nil {
		t.Fatalf("open stream toward the gateway: %v", err)
	}
	if err := tunnel.WriteServiceRequest(s, tunnel.ServiceRequest{Namespace: "cloud", Name: name, Port: 80}); err != nil {
		t.Fatalf("write request: %v", err)
	}
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(s)
	_, err = tunnel.ReadReply(br)
	return s, br, err
}

// TestServiceStream: a service request reaches the handler with the
// sender of the edge's certificate; a refusal comes back as a Reply; an
// accepted one relays both ways with half-close; an edge may hold more
// service streams at once than its control streams' limit.
func TestServiceStream(t *testing.T) {
	svc := &echoServices{addr: testenv.EchoServer(t).String()}
	f := startWith(t, func(o *Options) { o.Services, o.ServiceStreams = svc, 32 })
	edge := f.node("edge-1")

	_, _, err := openService(t, edge, "other")
	var re *tunnel.RefusedError
	if !errors.As(err, &re) || re.Code != tunnel.NotMarked {
		t.Fatalf("an unmarked Service: %v, want a not_marked refusal", err)
	}

	const n = tunnel.MaxStreamsToGateway + 8
	streams := make([]*quic.Stream, n)
	readers := make([]*bufio.Reader, n)
	for i := range n {
		s, br, err := openService(t, edge, "echo")
		if err != nil {
			t.Fatalf("service stream %d: %v", i, err)
		}
		streams[i], readers[i] = s, br
	}
	for i, s := range streams {
		if _, err := io.WriteString(s, "ping"); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if b, err := io.ReadAll(readers[i]); string(b) != "ping" || err != nil {
			t.Errorf("stream %d echoed %q, %v", i, b, err)
		}
	}
	// Each relay reports its end once both directions are done.
	testenv.Eventually(t, "every relay done", func() bool {
		svc.mu.Lock()
		defer svc.mu.Unlock()
		return svc.done == n
	})
	svc.mu.Lock()
	defer svc.mu.Unlock()
	for _, s := range svc.seen {
		if s != "edge-1" {
			t.Errorf("handler told sender %q, want edge-1", s)
		}
	}
}

// A gateway without a service handler answers BadRequest.
func TestServiceStreamNoHandler(t *testing.T) {
	f := startWith(t, func(o *Options) { o.Elections = &recordingElections{calls: make(chan electionCall, 1)} })
	_, _, err := openService(t, f.node("edge-1"), "echo")
	var re *tunnel.RefusedError
	if !errors.As(err, &re) || re.Code != tunnel.BadRequest {
		t.Fatalf("service stream without a handler: %v, want bad_request", err)
	}
}
