package poolstore

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/replica"
)

// members is an in-memory Members.
type members struct {
	mu    sync.Mutex
	pools map[string]string
	addrs map[string]string
}

var _ Members = (*members)(nil)

func (m *members) Pool(node string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.pools[node]
	return p, ok
}

func (m *members) Address(node string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.addrs[node]
	return a, ok
}

func (m *members) set(node, pool, addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if pool != "" {
		m.pools[node] = pool
	}
	if addr != "" {
		m.addrs[node] = addr
	}
}

// cluster is a test pool: one CA, a shared view of membership and of the
// leader, and nodes that each run a Server and a Follower on loopback.
type cluster struct {
	t       testing.TB
	ca      *testenv.CA
	gw      *testGateway
	members *members

	mu     sync.Mutex
	leader string
}

func newCluster(t testing.TB) *cluster {
	return &cluster{t: t, ca: testenv.MustCA(t, "cluster-ca"), gw: newTestGateway(t, "gateway-ca"),
		members: &members{pools: map[string]string{}, addrs: map[string]string{}}}
}

func (c *cluster) setLeader(n string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leader = n
}

func (c *cluster) leaderName() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

// peer returns the PeerConfig of a node holding cert, trusting cas.
func (c *cluster) peer(self string, cert tls.Certificate, cas *x509.CertPool) PeerConfig {
	return PeerConfig{Self: self, Members: c.members,
		Certificate: func() (*tls.Certificate, error) { return &cert, nil },
		CAs:         func() *x509.CertPool { return cas }}
}

// nodeCert issues name's node certificate from the cluster CA.
func (c *cluster) nodeCert(name string) tls.Certificate {
	c.t.Helper()
	kp, err := c.ca.NodeCert(name)
	if err != nil {
		c.t.Fatalf("%v", err)
	}
	return kp.TLS
}

// client is a Client for self (member of pool, or none if "") holding
// cert.
func (c *cluster) client(self, pool string, cert tls.Certificate, cas *x509.CertPool) *Client {
	c.t.Helper()
	c.members.set(self, pool, "")
	cl, err := NewClient(c.peer(self, cert, cas))
	if err != nil {
		c.t.Fatalf("%v", err)
	}
	c.t.Cleanup(cl.Close)
	return cl
}

// node is a cluster member with its store, server and follower.
type node struct {
	c        *cluster
	name     string
	path     string
	store    *replica.Store
	server   *Server
	follower *Follower
	reg      *prometheus.Registry

	mu       sync.Mutex
	delegate func(ctx context.Context, node string, lease []byte) error // nil: accept

	cancel context.CancelFunc
	done   sync.WaitGroup
}

// addNode starts a node of pool on loopback.
func (c *cluster) addNode(name, pool string) *node {
	c.t.Helper()
	n := &node{c: c, name: name, path: filepath.Join(c.t.TempDir(), replica.FileName)}
	c.members.set(name, pool, "")
	n.start()
	c.t.Cleanup(n.stop)
	return n
}

// start opens the store and runs the server and the follower.
func (n *node) start() {
	t := n.c.t
	t.Helper()
	var err error
	if n.store, err = replica.Open(n.path, nil); err != nil {
		t.Fatalf("%v", err)
	}
	cfg := n.c.peer(n.name, n.c.nodeCert(n.name), n.c.ca.Pool())
	n.reg = prometheus.NewRegistry()
	n.server, err = NewServer(ServerOptions{PeerConfig: cfg, Store: n.store, Leader: n.c.leaderName,
		SyncEvery: 50 * time.Millisecond, Registerer: n.reg,
		Delegate: func(ctx context.Context, node string, lease []byte) error {
			n.mu.Lock()
			d := n.delegate
			n.mu.Unlock()
			if d == nil {
				return nil
			}
			return d(ctx, node, lease)
		}})
	if err != nil {
		t.Fatalf("%v", err)
	}
	n.follower, err = NewFollower(FollowerOptions{PeerConfig: cfg, Store: n.store, Leader: n.c.leaderName, Verifier: n.c.verifier(),
		CheckInterval: 10 * time.Millisecond, StaleAfter: 2 * time.Second,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Registerer: n.reg})
	if err != nil {
		t.Fatalf("%v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("%v", err)
	}
	n.c.members.set(n.name, "", ln.Addr().String())
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.done.Go(func() {
		if err := n.server.Serve(ctx, ln); err != nil {
			t.Errorf("%s: serve: %v", n.name, err)
		}
	})
	n.done.Go(func() { n.follower.Run(ctx) })
}

// stop stops the server and the follower and closes the store; start
// runs them again on the same file.
func (n *node) stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	n.done.Wait()
	n.cancel = nil
	if err := n.store.Close(); err != nil {
		n.c.t.Errorf("%s: close store: %v", n.name, err)
	}
}

func (n *node) setDelegate(d func(ctx context.Context, node string, lease []byte) error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.delegate = d
}

// lead makes n the leader of a new term.
func (n *node) lead(epoch string) {
	n.c.t.Helper()
	if err := n.store.StartEpoch(epoch); err != nil {
		n.c.t.Fatalf("%v", err)
	}
	n.c.setLeader(n.name)
}

// value reads a counter or a gauge.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// converged has the gateway attest the leader's store as it is, then
// waits until every follower's digest is the leader's.
func converged(t testing.TB, leader *node, followers ...*node) {
	t.Helper()
	leader.c.attest(leader)
	for _, f := range followers {
		testenv.Eventually(t, f.name+" has "+leader.name+"'s content", func() bool {
			return f.store.Rev() == leader.store.Rev() && f.store.Digest() == leader.store.Digest()
		})
	}
}

// view is a Members that tells some nodes' pools otherwise than the
// cluster's (a follower whose trusted view differs from what the leader
// or its server believe); "" is no pool.
type view struct {
	Members
	mu    sync.Mutex
	pools map[string]string
}

func (v *view) Pool(node string) (string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if p, ok := v.pools[node]; ok {
		return p, p != ""
	}
	return v.Members.Pool(node)
}

func (v *view) set(node, pool string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.pools[node] = pool
}

// follower runs only a Follower of name (member of pool) on store, with
// o's bounds, Members and Clock (the cluster's and the real clock if not
// set); it stops when the test ends.
func (c *cluster) follower(name, pool string, store *replica.Store, o FollowerOptions) *Follower {
	c.t.Helper()
	c.members.set(name, pool, "")
	cfg := c.peer(name, c.nodeCert(name), c.ca.Pool())
	cfg.Clock, cfg.Logger = o.Clock, o.Logger
	if o.Members != nil {
		cfg.Members = o.Members
	}
	o.PeerConfig, o.Store, o.Leader = cfg, store, c.leaderName
	if o.Verifier == nil {
		o.Verifier = c.verifier()
	}
	o.CheckInterval = cmpOr(o.CheckInterval, 10*time.Millisecond)
	o.StaleAfter = cmpOr(o.StaleAfter, 2*time.Second)
	o.BackoffInitial = cmpOr(o.BackoffInitial, 10*time.Millisecond)
	o.BackoffMax = cmpOr(o.BackoffMax, 100*time.Millisecond)
	f, err := NewFollower(o)
	if err != nil {
		c.t.Fatalf("%v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var done sync.WaitGroup
	done.Go(func() { f.Run(ctx) })
	c.t.Cleanup(func() {
		cancel()
		done.Wait()
	})
	return f
}

// gatewayName is the name the cluster's gateway certificate is for.
const gatewayName = "tether-gateway"

// testGateway signs what tests put in a leader's store, as a gateway
// replica signs its feed (package feed).
type testGateway struct {
	ca *testenv.CA
	kp *testenv.KeyPair
}

func newTestGateway(t testing.TB, caName string) *testGateway {
	t.Helper()
	ca := testenv.MustCA(t, caName)
	kp, err := ca.ServerCert("gateway", gatewayName)
	if err != nil {
		t.Fatal(err)
	}
	return &testGateway{ca: ca, kp: kp}
}

// verifier trusts the cluster's gateway CA.
func (c *cluster) verifier() *feed.Verifier { return newVerifier(c.t, c.gw) }

// newVerifier trusts gw's CA for its name, as an edge trusts its
// --gateway-ca.
func newVerifier(t testing.TB, gw *testGateway) *feed.Verifier {
	t.Helper()
	v, err := feed.NewVerifier(feed.VerifierOptions{Roots: gw.ca.Pool, Names: []string{gatewayName}})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// sign signs h with the gateway's key.
func (g *testGateway) sign(t testing.TB, h feed.Header) json.RawMessage {
	t.Helper()
	h.Feed = "gw-test"
	if h.T.IsZero() {
		h.T = time.Now()
	}
	s, err := feed.Sign(g.kp.TLS.PrivateKey.(crypto.Signer), g.kp.TLS.Certificate[0], h)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// attest has the gateway attest every resource of n's store as it is
// (what a FeedSource records after a unit), and hands on its chain.
func (c *cluster) attest(n *node) {
	c.t.Helper()
	attestStore(c.t, c.gw, n.store)
}

func attestStore(t testing.TB, g *testGateway, s *replica.Store) {
	t.Helper()
	s.SetChains([][][]byte{g.kp.TLS.Certificate})
	for r, rv := range s.Resources() {
		h := feed.Header{Kind: feed.KindAttest, Resource: r, To: rv, Root: s.Root(r)}
		raw := g.sign(t, h)
		if err := s.Attest(r, raw, h); err != nil {
			t.Fatal(err)
		}
	}
}

// mark has the gateway mark n's store synced at at (every resource at
// its attested point).
func (c *cluster) mark(n *node, at time.Time) {
	c.t.Helper()
	markStore(c.t, c.gw, n.store, at)
}

func markStore(t testing.TB, g *testGateway, s *replica.Store, at time.Time) {
	t.Helper()
	points := map[string]feed.Point{}
	for r := range s.Resources() {
		p, ok := s.Point(r)
		if !ok {
			t.Fatalf("mark: %s not attested", r)
		}
		points[r] = p
	}
	s.SetMark(g.sign(t, feed.Header{Kind: feed.KindMark, T: at, Resources: points}), at)
}
