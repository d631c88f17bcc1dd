package edgetunnel

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/quic-go/quic-go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// serveElections answers the election streams an edge opens on conn with
// answer's reply (or, if it returns ok false, resets the stream) and
// sends each request on reqs, if set.
func serveElections(t *testing.T, conn *quic.Conn, reqs chan<- tunnel.ElectionRequest, answer func(tunnel.ElectionRequest) (tunnel.ElectionReply, bool)) {
	t.Helper()
	go func() {
		for {
			s, err := conn.AcceptStream(context.Background())
			if err != nil {
				return
			}
			go func() {
				req, err := tunnel.ReadElectionRequest(s)
				if err != nil {
					t.Errorf("gateway reads request: %v", err)
					s.CancelRead(0)
					s.CancelWrite(0)
					return
				}
				if reqs != nil {
					reqs <- req
				}
				rep, ok := answer(req)
				if !ok {
					s.CancelRead(0)
					s.CancelWrite(0)
					return
				}
				tunnel.WriteElectionReply(s, rep)
				s.Close()
			}()
		}
	}()
}

func electionAnswer(rep tunnel.ElectionReply) func(tunnel.ElectionRequest) (tunnel.ElectionReply, bool) {
	return func(tunnel.ElectionRequest) (tunnel.ElectionReply, bool) { return rep, true }
}

var (
	testElection = tunnel.ElectionRequest{Op: tunnel.ElectionUpdate, Record: tunnel.RecordElection, Pool: "shop",
		ConfigMap: []byte(`{"metadata":{"name":"pool-shop","namespace":"tether-system","resourceVersion":"6"}}`)}
	storedRecord = []byte(`{"metadata":{"name":"pool-shop","namespace":"tether-system","resourceVersion":"7"}}`)
)

func TestWriteElectionRecord(t *testing.T) {
	_, gw, e, _ := setup(t, Options{})
	reqs := make(chan tunnel.ElectionRequest, 2)
	var mu sync.Mutex
	reply := tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.OK}, ConfigMap: storedRecord}
	serveElections(t, gw.nextConn(), reqs, func(tunnel.ElectionRequest) (tunnel.ElectionReply, bool) {
		mu.Lock()
		defer mu.Unlock()
		return reply, true
	})
	testenv.Eventually(t, "connected", func() bool { return e.Ready() == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	stored, err := e.WriteElectionRecord(ctx, testElection)
	if err != nil || string(stored) != string(storedRecord) {
		t.Fatalf("WriteElectionRecord = %s, %v; want the stored record", stored, err)
	}
	if got := <-reqs; !cmp.Equal(got, testElection) {
		t.Fatalf("gateway got %+v", got)
	}

	mu.Lock()
	reply = tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.Conflict, Message: "the object has been modified"}}
	mu.Unlock()
	stored, err = e.WriteElectionRecord(ctx, testElection)
	var re *ElectionRefusedError
	if !errors.As(err, &re) || re.Code != tunnel.Conflict || re.Pool != "shop" || re.Record != tunnel.RecordElection ||
		re.Message != "the object has been modified" || re.Gateway != gw.addr.String() || stored != nil {
		t.Fatalf("WriteElectionRecord = %s, %v; want a *ElectionRefusedError conflict from %s", stored, err, gw.addr)
	}
	<-reqs
	if ok, conflict := e.metric("tether_edge_tunnel_election_writes_total", "result", "ok"),
		e.metric("tether_edge_tunnel_election_writes_total", "result", "conflict"); ok != 1 || conflict != 1 {
		t.Errorf("election_writes_total: ok %v, conflict %v; want 1 and 1", ok, conflict)
	}
}

func TestWriteElectionRecordBadRequestLocally(t *testing.T) {
	_, gw, e, _ := setup(t, Options{})
	reqs := make(chan tunnel.ElectionRequest, 4)
	serveElections(t, gw.nextConn(), reqs, electionAnswer(tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.OK}, ConfigMap: storedRecord}))
	testenv.Eventually(t, "connected", func() bool { return e.Ready() == nil })
	for name, req := range map[string]tunnel.ElectionRequest{
		"no pool":      {Op: tunnel.ElectionCreate, Record: tunnel.RecordElection, ConfigMap: []byte("{}")},
		"no ConfigMap": {Op: tunnel.ElectionCreate, Record: tunnel.RecordElection, Pool: "shop"},
		"no op":        {Record: tunnel.RecordSync, Pool: "shop", ConfigMap: []byte("{}")},
	} {
		if _, err := e.WriteElectionRecord(context.Background(), req); !errors.Is(err, tunnel.ErrBadHeader) {
			t.Errorf("%s: err = %v, want ErrBadHeader", name, err)
		}
	}
	select {
	case req := <-reqs:
		t.Errorf("gateway got %+v", req)
	default:
	}
}

func TestWriteElectionRecordNoGateway(t *testing.T) {
	ca := testenv.MustCA(t, "edgetunnel-test")
	e := startEdge(t, Options{Gateways: []string{closedUDPPort(t)}, AllowPorts: []uint16{1}}, ca, ca)
	if _, err := e.WriteElectionRecord(context.Background(), testElection); !errors.Is(err, ErrNoGateway) {
		t.Fatalf("err = %v, want ErrNoGateway", err)
	}
}

// Two replicas: one that cannot serve or whose stream fails makes the edge
// ask the other; a conflict or a refusal about the cluster's objects is
// final (another replica reads the same objects).
func TestWriteElectionRecordReplicas(t *testing.T) {
	for _, tc := range []struct {
		name      string
		first     func(tunnel.ElectionRequest) (tunnel.ElectionReply, bool)
		askSecond bool
		wantCode  tunnel.Code
	}{
		{"unavailable", electionAnswer(tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.Unavailable}}), true, tunnel.OK},
		{"stream reset", func(tunnel.ElectionRequest) (tunnel.ElectionReply, bool) { return tunnel.ElectionReply{}, false }, true, tunnel.OK},
		{"conflict", electionAnswer(tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.Conflict}}), false, tunnel.Conflict},
		{"not holder", electionAnswer(tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.NotHolder}}), false, tunnel.NotHolder},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca := testenv.MustCA(t, "edgetunnel-test")
			gw1 := startGateway(t, gatewayPKI{serverCA: ca, clientCA: ca}, "127.0.0.1:0")
			gw2 := startGateway(t, gatewayPKI{serverCA: ca, clientCA: ca}, "127.0.0.1:0")
			e := startEdge(t, Options{Gateways: []string{gw1.addr.String(), gw2.addr.String()}, AllowPorts: []uint16{1}}, ca, ca)
			var mu sync.Mutex
			asked := 0
			answer := func(req tunnel.ElectionRequest) (tunnel.ElectionReply, bool) {
				mu.Lock()
				asked++
				n := asked
				mu.Unlock()
				if n == 1 {
					return tc.first(req)
				}
				return tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.OK}, ConfigMap: storedRecord}, true
			}
			serveElections(t, gw1.nextConn(), nil, answer)
			serveElections(t, gw2.nextConn(), nil, answer)
			testenv.Eventually(t, "both replicas connected", func() bool {
				st := e.Status()
				return len(st) == 2 && st[0].Connected && st[1].Connected
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stored, err := e.WriteElectionRecord(ctx, testElection)
			var re *ElectionRefusedError
			switch {
			case tc.wantCode == tunnel.OK && (err != nil || string(stored) != string(storedRecord)):
				t.Fatalf("WriteElectionRecord = %s, %v; want the second replica's record", stored, err)
			case tc.wantCode != tunnel.OK && (!errors.As(err, &re) || re.Code != tc.wantCode):
				t.Fatalf("err = %v, want a %v refusal", err, tc.wantCode)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := map[bool]int{true: 2, false: 1}[tc.askSecond]; asked != want {
				t.Errorf("%d replicas asked, want %d", asked, want)
			}
		})
	}
}

// PoolRecords is the writer poolstore elects with: its writes become
// election requests of the right operation and kind, the stored record
// comes back decoded, and a conflict as the apiserver's.
func TestPoolRecords(t *testing.T) {
	_, gw, e, _ := setup(t, Options{})
	reqs := make(chan tunnel.ElectionRequest, 4)
	var mu sync.Mutex
	reply := tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.OK}, ConfigMap: storedRecord}
	serveElections(t, gw.nextConn(), reqs, func(tunnel.ElectionRequest) (tunnel.ElectionReply, bool) {
		mu.Lock()
		defer mu.Unlock()
		return reply, true
	})
	testenv.Eventually(t, "connected", func() bool { return e.Ready() == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w := PoolRecords{Client: e.Client}
	sync := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pool-shop-sync", Namespace: "tether-system"},
		Data: map[string]string{"holderIdentity": "edge-1"}}
	stored, err := w.WriteRecord(ctx, record.Write{Kind: record.KindSync, Pool: "shop", Create: true, ConfigMap: sync})
	if err != nil || stored.ResourceVersion != "7" || stored.Name != "pool-shop" {
		t.Fatalf("WriteRecord = %+v, %v; want the stored record", stored, err)
	}
	req := <-reqs
	var sent corev1.ConfigMap
	if err := json.Unmarshal(req.ConfigMap, &sent); err != nil {
		t.Fatal(err)
	}
	if req.Op != tunnel.ElectionCreate || req.Record != tunnel.RecordSync || req.Pool != "shop" || !cmp.Equal(sent, *sync) {
		t.Fatalf("gateway got %v %v %s %+v", req.Op, req.Record, req.Pool, sent)
	}

	mu.Lock()
	reply = tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.Conflict, Message: "the object has been modified"}}
	mu.Unlock()
	rec := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pool-shop", Namespace: "tether-system", ResourceVersion: "6"}}
	if _, err := w.WriteRecord(ctx, record.Write{Kind: record.KindElection, Pool: "shop", ConfigMap: rec}); !apierrors.IsConflict(err) {
		t.Fatalf("err = %v, want a conflict", err)
	}
	if req := <-reqs; req.Op != tunnel.ElectionUpdate || req.Record != tunnel.RecordElection {
		t.Fatalf("gateway got %v %v", req.Op, req.Record)
	}
	mu.Lock()
	reply = tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.NotHolder}}
	mu.Unlock()
	_, err = w.WriteRecord(ctx, record.Write{Kind: record.KindElection, Pool: "shop", ConfigMap: rec})
	var re *ElectionRefusedError
	if !errors.As(err, &re) || re.Code != tunnel.NotHolder || apierrors.IsConflict(err) {
		t.Fatalf("err = %v, want a not_holder refusal", err)
	}
}
