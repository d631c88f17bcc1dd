package poolstore

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/testenv"
)

func TestPeerRefusals(t *testing.T) {
	c := newCluster(t)
	l := c.addNode("l", "a")
	l.lead("l/1")
	mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("ns", "a", 5)}, 10))
	other := testenv.MustCA(t, "other-ca")
	trustBoth := c.ca.Pool()
	trustBoth.AddCert(other.Cert)
	fromOther, err := other.NodeCert("x")
	mustNil(t, err)
	admin, err := c.ca.ClientCert("admin", "system:masters")
	mustNil(t, err)

	for _, tc := range []struct {
		name, self, pool string
		cert             tls.Certificate
		reason           string
		forbidden        bool // answered 403; else the handshake fails
	}{
		{"another pool", "b1", "b", c.nodeCert("b1"), refusedOtherPool, true},
		{"unknown node", "stranger", "", c.nodeCert("stranger"), refusedUnknownNode, true},
		{"another CA", "x", "a", fromOther.TLS, refusedBadCertificate, false},
		{"not a node", "admin", "a", admin.TLS, refusedNotANode, false},
		{"no certificate", "anon", "a", tls.Certificate{}, refusedNoCertificate, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := c.client(tc.self, tc.pool, tc.cert, trustBoth)
			counted := l.server.m.refused.WithLabelValues(tc.reason)
			before := value(counted)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := cl.replicate(ctx, "l", "", 0)
			if err == nil {
				resp.Body.Close()
				t.Fatal("stream opened")
			}
			pe, isPeerErr := errors.AsType[*PeerError](err)
			switch {
			case tc.forbidden && (!isPeerErr || pe.StatusCode != http.StatusForbidden || pe.Reason != reasonForbidden):
				t.Fatalf("err = %v, want a 403 Forbidden", err)
			case !tc.forbidden && isPeerErr:
				t.Fatalf("err = %v, want the handshake to fail", err)
			}
			testenv.Eventually(t, "the refusal is counted", func() bool { return value(counted) == before+1 })
			if n := value(l.server.m.bytes); n != 0 {
				t.Fatalf("the leader sent %v bytes of frames", n)
			}
		})
	}
}

func TestClientVerifiesPeer(t *testing.T) {
	c := newCluster(t)
	c.addNode("l", "a")
	ctx := context.Background()

	// "ghost"'s address leads to l: its certificate does not name ghost.
	addr, _ := c.members.Address("l")
	c.members.set("ghost", "a", addr)
	cl := c.client("f", "a", c.nodeCert("f"), c.ca.Pool())
	if _, err := cl.AskLeader(ctx, "ghost"); err == nil || !strings.Contains(err.Error(), "is node l, not ghost") {
		t.Fatalf("asking an impostor: %v, want the node names to differ", err)
	}
	// A client that does not trust the cluster CA refuses every peer.
	cl = c.client("g", "a", c.nodeCert("g"), testenv.MustCA(t, "unrelated").Pool())
	if _, err := cl.AskLeader(ctx, "l"); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("asking a peer of an untrusted CA: %v", err)
	}
	if _, err := c.client("h", "a", c.nodeCert("h"), c.ca.Pool()).AskLeader(ctx, "l"); err != nil {
		t.Fatalf("asking a genuine peer: %v", err)
	}
}

func TestAskLeader(t *testing.T) {
	c := newCluster(t)
	l, f1, f2 := c.addNode("l", "a"), c.addNode("f1", "a"), c.addNode("f2", "a")
	l.lead("l/1")
	mustNil(t, l.store.Replace(slices_, nil, 1))
	converged(t, l, f2)
	info, err := f1.follower.Client().AskLeader(context.Background(), "f2")
	mustNil(t, err)
	if info.Node != "f2" || info.Leader != "l" || info.Epoch != "l/1" || info.Rev != l.store.Rev() {
		t.Fatalf("f2 says %+v", info)
	}
}

func TestHeartbeatDelegation(t *testing.T) {
	c := newCluster(t)
	l, f1 := c.addNode("l", "a"), c.addNode("f1", "a")
	c.addNode("f2", "a")
	type call struct {
		node  string
		lease []byte
	}
	var (
		mu    sync.Mutex
		calls []call
		fail  error
	)
	l.setDelegate(func(ctx context.Context, node string, lease []byte) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, call{node, lease})
		return fail
	})
	numCalls := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(calls)
	}
	ctx := context.Background()

	// Before anyone leads: nobody to send to.
	if err := f1.follower.DelegateToLeader(ctx, leaseOf(t, "f1", corev1.NamespaceNodeLease)); err == nil {
		t.Fatal("delegated with no leader known")
	}
	l.lead("l/1")

	own := leaseOf(t, "f1", corev1.NamespaceNodeLease)
	mustNil(t, f1.follower.DelegateToLeader(ctx, own))
	if numCalls() != 1 || calls[0].node != "f1" || !bytes.Equal(calls[0].lease, own) {
		t.Fatalf("Delegate calls: %+v, want one for f1 with its Lease", calls)
	}

	wantStatus := func(err error, code int, reason string) {
		t.Helper()
		pe, ok := errors.AsType[*PeerError](err)
		if !ok || pe.StatusCode != code || pe.Reason != reason {
			t.Fatalf("err = %v, want %d %s", err, code, reason)
		}
	}
	// Another node's Lease, or its own name elsewhere: refused, not passed on.
	wantStatus(f1.follower.DelegateToLeader(ctx, leaseOf(t, "f2", corev1.NamespaceNodeLease)), http.StatusForbidden, reasonForbidden)
	wantStatus(f1.follower.DelegateToLeader(ctx, leaseOf(t, "f1", "default")), http.StatusForbidden, reasonForbidden)
	wantStatus(f1.follower.DelegateToLeader(ctx, []byte(`{"kind":"Secret","metadata":{"name":"f1"}}`)), http.StatusBadRequest, reasonBadRequest)
	wantStatus(f1.follower.DelegateToLeader(ctx, bytes.Repeat([]byte(" "), maxLeaseBytes+1)), http.StatusRequestEntityTooLarge, reasonBadRequest)
	if n := numCalls(); n != 1 {
		t.Fatalf("Delegate called %d times, want only for the own Lease", n)
	}
	if n := value(l.server.m.heartbeats.WithLabelValues(heartbeatRefused)); n != 2 {
		t.Fatalf("refused heartbeats counted: %v, want 2", n)
	}

	// The cloud cannot be reached: 503.
	mu.Lock()
	fail = errors.New("tunnel down")
	mu.Unlock()
	wantStatus(f1.follower.DelegateToLeader(ctx, own), http.StatusServiceUnavailable, reasonUnavailable)

	// A follower is not the leader, and says who is.
	err := f1.follower.Client().SendHeartbeat(ctx, "f2", own)
	pe, _ := errors.AsType[*PeerError](err)
	if !errors.Is(err, ErrNotLeader) || pe.StatusCode != http.StatusServiceUnavailable || pe.Leader != "l" {
		t.Fatalf("heartbeat to a follower: %v (%+v), want 503 NotLeader naming l", err, pe)
	}
	if _, err := f1.follower.Client().replicate(ctx, "f2", "", 0); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("replicating from a follower: %v, want ErrNotLeader", err)
	}
}

// leaseOf is the node Lease of node, in namespace.
func leaseOf(t *testing.T, node, namespace string) []byte {
	t.Helper()
	b, err := json.Marshal(&coordinationv1.Lease{
		TypeMeta:   metav1.TypeMeta{Kind: "Lease", APIVersion: "coordination.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: namespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: &metav1.MicroTime{Time: time.Now()}},
	})
	mustNil(t, err)
	return b
}
