package tunnelserver

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-edge/tether/gateway/internal/edgetest"
	"github.com/tether-edge/tether/tunnel"
)

// recordingElections answers every election request with reply and
// records what it was given.
type recordingElections struct {
	mu    sync.Mutex // guards reply, which a test may change while the server runs
	reply tunnel.ElectionReply
	calls chan electionCall
}

func (r *recordingElections) setReply(rep tunnel.ElectionReply) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reply = rep
}

type electionCall struct {
	sender string
	req    tunnel.ElectionRequest
}

func (r *recordingElections) Elect(_ context.Context, sender string, req tunnel.ElectionRequest) tunnel.ElectionReply {
	r.calls <- electionCall{sender, req}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reply
}

// elect opens a stream on the edge's connection, writes raw and reads the
// gateway's election reply.
func elect(t *testing.T, edge *edgetest.Edge, raw []byte) (tunnel.ElectionReply, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := edge.Conn().OpenStreamSync(ctx)
	if err != nil {
		t.Fatalf("open stream toward the gateway: %v", err)
	}
	if _, err := s.Write(raw); err != nil {
		t.Fatalf("write request: %v", err)
	}
	s.Close()
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	return tunnel.ReadElectionReply(s)
}

// An edge's election stream reaches the election handler with the node
// name of the edge's certificate; the handler's reply, stored record
// included, reaches the edge.
func TestElectionStream(t *testing.T) {
	el := &recordingElections{calls: make(chan electionCall, 4),
		reply: tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.OK}, ConfigMap: []byte(`{"metadata":{"resourceVersion":"7"}}`)}}
	f := startWith(t, func(o *Options) { o.Elections = el })
	edge := f.node("edge-1")

	sent := tunnel.ElectionRequest{Op: tunnel.ElectionUpdate, Record: tunnel.RecordElection, Pool: "shop",
		ConfigMap: []byte(`{"metadata":{"name":"pool-shop","resourceVersion":"6"}}`)}
	raw, err := tunnel.AppendElectionRequest(nil, sent)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := elect(t, edge, raw)
	if want := (tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.OK}, ConfigMap: []byte(`{"metadata":{"resourceVersion":"7"}}`)}); err != nil || !cmp.Equal(rep, want) {
		t.Fatalf("reply %+v, %v; want %+v", rep, err, want)
	}
	if call := <-el.calls; call.sender != "edge-1" || !cmp.Equal(call.req, sent) {
		t.Fatalf("handler got %+v", call)
	}

	el.setReply(tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.NotHolder, Message: "names edge-2"}})
	rep, err = elect(t, edge, raw)
	var re *tunnel.RefusedError
	if !errors.As(err, &re) || re.Code != tunnel.NotHolder || rep.Message != "names edge-2" || rep.ConfigMap != nil {
		t.Fatalf("reply %+v, %v; want a not_holder refusal", rep, err)
	}
	<-el.calls

	// This gateway has no heartbeat handler: a delegated heartbeat is a bad
	// request.
	hb, _ := tunnel.AppendDelegateRequest(nil, tunnel.DelegateRequest{Node: "edge-2", Lease: []byte("{}")})
	if rep, err := delegate(t, edge, hb); rep.Code != tunnel.BadRequest || err == nil {
		t.Fatalf("delegated heartbeat without a handler: %+v, %v; want bad_request", rep, err)
	}
	if served, bad := f.edgeStreams(streamServed), f.edgeStreams(streamBadRequest); served != 2 || bad != 1 {
		t.Errorf("served %v, bad_request %v; want 2 and 1", served, bad)
	}
}

// A gateway with a heartbeat handler only answers election requests
// BadRequest, and a malformed election request never reaches a handler.
func TestElectionStreamBadRequest(t *testing.T) {
	hb := &recordingHeartbeats{calls: make(chan heartbeatCall, 4)}
	f := startWith(t, func(o *Options) { o.Heartbeats = hb })
	edge := f.node("edge-1")
	good, _ := tunnel.AppendElectionRequest(nil, tunnel.ElectionRequest{Op: tunnel.ElectionCreate, Record: tunnel.RecordSync,
		Pool: "shop", ConfigMap: []byte("{}")})
	for name, raw := range map[string][]byte{
		"no election handler": good,
		"op 7":                {1, 3, 0, 6, 7, 1, 1, 'p', '{', '}'},
		"bad pool":            {1, 3, 0, 6, 1, 1, 1, '/', '{', '}'},
	} {
		rep, err := elect(t, edge, raw)
		if rep.Code != tunnel.BadRequest || err == nil {
			t.Errorf("%s: reply %+v, %v; want bad_request", name, rep, err)
		}
	}
	select {
	case c := <-hb.calls:
		t.Fatalf("an election request reached the heartbeat handler: %+v", c)
	default:
	}
}
