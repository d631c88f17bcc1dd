package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/replica"
)

// epsResource is the replica's key of EndpointSlices.
const epsResource = "discovery.k8s.io/v1/endpointslices"

// simFollower is a pool member played in this process by the project's
// own follower code: a replica.Store on a bbolt file of its own and a
// poolstore.Follower streaming from the leader over its own TLS
// connection, with its own node certificate (CN=system:node:<name>). On
// the wire it is a tether-edge follower: the leader authorises it by its
// certificate and its Node's pool label, as any member. Its connection
// leaves from the namespace of a LAN host of the site (src) by way of a
// forwarder in this process, which counts the bytes: poolstore.Client
// dials from the process's own namespace, the forwarder from src's.
type simFollower struct {
	name  string
	store *replica.Store
	reg   *prometheus.Registry
	fwd   *forwarder
	f     *poolstore.Follower
	track *tracker
}

// simMembers is a simulated follower's view of the pool: itself and the
// leader are in pool; the leader's listener is its forwarder's address.
type simMembers struct {
	pool, self, leader, leaderAddr string
}

var _ poolstore.Members = simMembers{}

func (m simMembers) Pool(node string) (string, bool) {
	if node == m.self || node == m.leader {
		return m.pool, true
	}
	return "", false
}

func (m simMembers) Address(node string) (string, bool) {
	if node == m.leader {
		return m.leaderAddr, true
	}
	return "", false
}

// simName is the node name of simulated follower k (1-based).
func simName(k int) string { return fmt.Sprintf("sim-%03d", k) }

// newSimFollower opens name's store in dir and builds its follower of
// leader, whose pool listener is at leaderAddr as seen from src.
func newSimFollower(name, dir string, cert tls.Certificate, ca *testenv.CA, verifier func() (*feed.Verifier, error), src *testenv.Host,
	leader, leaderAddr string, n int, log *slog.Logger) (*simFollower, error) {
	store, err := replica.Open(filepath.Join(dir, name, replica.FileName), log)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	fwd, err := newForwarder(src, leaderAddr)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	v, err := verifier()
	if err != nil {
		fwd.close()
		store.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	sf := &simFollower{name: name, store: store, reg: prometheus.NewRegistry(), fwd: fwd, track: newTracker(store, n)}
	members := simMembers{pool: siteName, self: name, leader: leader, leaderAddr: fwd.addr()}
	pools := ca.Pool()
	sf.f, err = poolstore.NewFollower(poolstore.FollowerOptions{
		PeerConfig: poolstore.PeerConfig{Self: name, Members: members, Logger: log.With("node", name),
			Certificate: func() (*tls.Certificate, error) { return &cert, nil },
			CAs:         func() *x509.CertPool { return pools }},
		Store:      store,
		Verifier:   v,
		Leader:     func() string { return leader },
		Registerer: sf.reg,
	})
	if err != nil {
		fwd.close()
		store.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return sf, nil
}

// run runs the follower, its forwarder and its tracker until ctx ends,
// then closes the store.
func (sf *simFollower) run(ctx context.Context) error {
	defer sf.store.Close()
	defer sf.fwd.close()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return sf.f.Run(ctx) })
	g.Go(func() error { sf.fwd.serve(ctx); return nil })
	g.Go(func() error { sf.track.run(ctx); return nil })
	return g.Wait()
}

// receivedBytes is tether_edge_pool_bytes_received_total of the follower:
// the replication frames' bytes.
func (sf *simFollower) receivedBytes() float64 {
	mfs, err := sf.reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() == "tether_edge_pool_bytes_received_total" && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// forwarder is a simulated follower's way to the leader: it accepts on
// loopback in this process's namespace and dials the leader from src's
// namespace, so the follower's connection crosses the site's LAN. It
// counts the bytes it carries: down is leader → follower (TLS records,
// without TCP/IP headers).
type forwarder struct {
	ln     net.Listener
	src    *testenv.Host
	target string
	down   atomic.Int64
	up     atomic.Int64
	conns  atomic.Int64
	wg     sync.WaitGroup
}

func newForwarder(src *testenv.Host, target string) (*forwarder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("forwarder to %s: %w", target, err)
	}
	return &forwarder{ln: ln, src: src, target: target}, nil
}

func (fw *forwarder) addr() string { return fw.ln.Addr().String() }

func (fw *forwarder) close() {
	fw.ln.Close()
	fw.wg.Wait()
}

// serve forwards each accepted connection until ctx ends.
func (fw *forwarder) serve(ctx context.Context) {
	go func() {
		<-ctx.Done()
		fw.ln.Close()
	}()
	for {
		c, err := fw.ln.Accept()
		if err != nil {
			return
		}
		fw.wg.Add(1)
		go func() {
			defer fw.wg.Done()
			fw.forward(ctx, c)
		}()
	}
}

func (fw *forwarder) forward(ctx context.Context, c net.Conn) {
	defer c.Close()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	u, err := fw.src.DialContext(dctx, "tcp", fw.target)
	cancel()
	if err != nil {
		return
	}
	defer u.Close()
	fw.conns.Add(1)
	stop := context.AfterFunc(ctx, func() { c.Close(); u.Close() })
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(countingWriter{c, &fw.down}, u)
		c.Close()
	}()
	io.Copy(countingWriter{u, &fw.up}, c)
	u.Close()
	<-done
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (cw countingWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.n.Add(int64(n))
	return n, err
}

// bytes is what the forwarder carried so far.
func (fw *forwarder) bytes() traffic { return traffic{down: fw.down.Load(), up: fw.up.Load()} }

// tracker notes when a simulated follower's replica holds each slice of
// namespace bench with the current round's marker: the moment the
// replicated change is in its store, which the node's kube-proxy would
// then read.
type tracker struct {
	store *replica.Store

	mu      sync.Mutex
	round   int
	got     []time.Time
	missing int
	done    chan struct{}
}

func newTracker(store *replica.Store, n int) *tracker {
	return &tracker{store: store, got: make([]time.Time, n), done: make(chan struct{})}
}

// expect starts round r.
func (t *tracker) expect(r int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.round = r
	clear(t.got)
	t.missing = len(t.got)
	t.done = make(chan struct{})
}

// run reads the store's changes as they come until ctx ends.
func (t *tracker) run(ctx context.Context) {
	var epoch string
	var rev uint64
	for {
		changed := t.store.Changed()
		now := time.Now()
		if e := t.store.Epoch(); e != epoch {
			// A snapshot was loaded: what it holds arrived now.
			epoch, rev = e, t.store.Rev()
			objs, _, _, _ := t.store.List(epsResource)
			for _, o := range objs {
				t.see(o.Namespace, o.Name, o.Raw, now)
			}
		} else if cs, err := t.store.Since(rev); err != nil {
			rev = t.store.Rev()
		} else if len(cs) > 0 {
			for _, c := range cs {
				if c.Resource == epsResource && (c.Type == replica.Added || c.Type == replica.Modified) {
					t.see(c.Namespace, c.Name, c.Object, now)
				}
			}
			rev = cs[len(cs)-1].Rev
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// see notes slice name's arrival if raw carries the round's marker.
func (t *tracker) see(namespace, name string, raw []byte, now time.Time) {
	if namespace != benchNS || !strings.HasPrefix(name, "svc-") {
		return
	}
	i, err := strconv.Atoi(strings.TrimPrefix(name, "svc-"))
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil || t.round == 0 || i < 0 || i >= len(t.got) || !t.got[i].IsZero() ||
		!bytes.Contains(raw, []byte(`"`+marker(t.round, i)+`"`)) {
		return
	}
	t.got[i] = now
	t.missing--
	if t.missing == 0 {
		close(t.done)
	}
}

// wait waits until every slice of the round arrived, or ctx ends; it
// returns the arrival times (zero for those missing).
func (t *tracker) wait(ctx context.Context, name string) ([]time.Time, error) {
	t.mu.Lock()
	done := t.done
	t.mu.Unlock()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("%s: %d of %d changes not replicated: %w", name, t.missing, len(t.got), err)
	}
	return append([]time.Time(nil), t.got...), err
}
