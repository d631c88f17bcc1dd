package tunnelserver

import (
	"bufio"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/tether-edge/tether/gateway/internal/edgetest"
	"github.com/tether-edge/tether/tunnel"
)

// fakePoolFeeds refuses senders other than leader with NotLeader, and
// serves leader a line, then waits for the stream's end.
type fakePoolFeeds struct {
	leader string
	calls  chan tunnel.PoolFeedRequest
	ended  chan error
}

func (p *fakePoolFeeds) ServePoolFeed(ctx context.Context, sender string, req tunnel.PoolFeedRequest, w io.Writer, reply func(tunnel.Reply) error) error {
	p.calls <- req
	if sender != p.leader {
		return reply(tunnel.Reply{Code: tunnel.NotLeader, Message: "pool " + req.Pool + " is led by " + p.leader})
	}
	if err := reply(tunnel.Reply{Code: tunnel.OK}); err != nil {
		return err
	}
	if _, err := w.Write([]byte("frame\n")); err != nil {
		return err
	}
	<-ctx.Done()
	p.ended <- context.Cause(ctx)
	return ctx.Err()
}

// openFeed opens a pool feed stream on the edge's connection and reads
// the reply.
func openFeed(t *testing.T, edge *edgetest.Edge, pool string) (*bufio.Reader, func(), error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := edge.Conn().OpenStreamSync(ctx)
	if err != nil {
		t.Fatalf("open stream toward the gateway: %v", err)
	}
	if err := tunnel.WritePoolFeedRequest(s, tunnel.PoolFeedRequest{Pool: pool}); err != nil {
		t.Fatalf("write request: %v", err)
	}
	s.Close()
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(s)
	_, err = tunnel.ReadReply(br)
	return br, func() { s.CancelRead(0) }, err
}

// TestPoolFeedStream: a pool feed request reaches the handler with the
// sender of the edge's certificate; a refusal comes back as a Reply; an
// accepted feed flows past edgeHandleTimeout's place until the edge
// stops reading, which ends the handler's context.
func TestPoolFeedStream(t *testing.T) {
	pf := &fakePoolFeeds{leader: "edge-1", calls: make(chan tunnel.PoolFeedRequest, 4), ended: make(chan error, 1)}
	f := startWith(t, func(o *Options) { o.PoolFeeds = pf })

	_, _, err := openFeed(t, f.node("edge-2"), "shop")
	var re *tunnel.RefusedError
	if !errors.As(err, &re) || re.Code != tunnel.NotLeader {
		t.Fatalf("a follower's pool feed: %v, want a not_leader refusal", err)
	}
	if req := <-pf.calls; req.Pool != "shop" {
		t.Errorf("handler got pool %q", req.Pool)
	}

	br, stop, err := openFeed(t, f.node("edge-1"), "shop")
	if err != nil {
		t.Fatalf("the leader's pool feed: %v", err)
	}
	<-pf.calls
	if line, err := br.ReadString('\n'); line != "frame\n" || err != nil {
		t.Fatalf("feed: %q, %v", line, err)
	}
	select {
	case err := <-pf.ended:
		t.Fatalf("the feed ended before the edge stopped reading: %v", err)
	default:
	}
	stop()
	select {
	case err := <-pf.ended:
		if err == nil {
			t.Error("the feed's context ended without a cause")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the feed went on after the edge stopped reading")
	}
	if served := f.edgeStreams(streamServed); served != 2 {
		t.Errorf("served %v, want 2", served)
	}
}

// A gateway without a pool feed handler answers a pool feed request
// BadRequest.
func TestPoolFeedStreamNoHandler(t *testing.T) {
	f := startWith(t, func(o *Options) { o.Elections = &recordingElections{calls: make(chan electionCall, 1)} })
	_, _, err := openFeed(t, f.node("edge-1"), "shop")
	var re *tunnel.RefusedError
	if !errors.As(err, &re) || re.Code != tunnel.BadRequest {
		t.Fatalf("pool feed without a handler: %v, want bad_request", err)
	}
}
