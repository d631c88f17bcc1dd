// Package registry is the gateway's table of connected edges: which QUIC
// connection serves which node, and what each one is doing.
//
// An edge is keyed by the node name in its verified client certificate
// (tunnel.NodeName), never by anything the edge says. There is at most one
// live registration per node in a gateway replica: a new connection for a
// node replaces the old one, which is closed with tunnel.CloseReplaced.
// Only a certificate naming that same node can do so, since the name is the
// key.
//
// A node's key that reconnects in a loop (a stolen key, or two machines
// with one certificate) would replace the registration at every
// handshake, kicking the other connection off and logging each time. So
// replacements are bounded per node: a bucket of Options.ReplaceBurst
// (DefaultReplaceBurst, 10) given back one per Options.ReplaceEvery
// (DefaultReplaceEvery, 6 s); a registration that would replace another
// with the bucket empty is refused (ErrReplacedTooOften) and the current
// one kept. Replacements and refusals are logged at most one line per node
// per ReplaceLogEvery (a minute), with the count of those left out, and
// counted in tether_gateway_edge_registrations_total.
//
// Open gives a caller (the transparent proxy) a stream to a node's edge.
// Each edge has a semaphore of Options.MaxStreams slots; a stream holds a
// slot until it is released, and Open refuses with ErrOverloaded when no
// slot frees up within Options.OpenWait. The same limit is enforced by the
// edge (tunnel.QUICConfig's MaxIncomingStreams); the semaphore turns a
// stuck OpenStreamSync into a prompt, counted refusal.
//
// Per edge the registry keeps the time it connected, open streams, bytes
// relayed each way and refusals by reason; RTT and the remote address
// come from the QUIC connection at the moment asked (the address changes
// when the edge's NAT rebinds or the edge migrates the connection). Edges returns all of it for /status, and the
// registry's Prometheus collector exports it at scrape time.
package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/tunnel"
)

// Defaults for Options.
const (
	DefaultMaxStreams   = 1024
	DefaultOpenWait     = time.Second
	DefaultReplaceBurst = 10
	DefaultReplaceEvery = 6 * time.Second
)

// ReplaceLogEvery is the least interval between two log lines about one
// node's replaced or refused registrations.
const ReplaceLogEvery = time.Minute

// Refusal reasons the registry itself gives (see Reason). They share the
// label space of tunnel.Code's names, so "overloaded" means the same thing
// whichever side said it.
const (
	ReasonNoTunnel   = "no_tunnel"
	ReasonOverloaded = "overloaded"
	ReasonOpenFailed = "open_failed"
)

// Errors returned by Open, to be told apart with errors.Is.
var (
	// ErrNoTunnel: the node has no live tunnel to this replica.
	ErrNoTunnel = errors.New("no tunnel to node")
	// ErrOverloaded: every stream slot of the edge stayed busy for
	// Options.OpenWait.
	ErrOverloaded = errors.New("edge has no free stream slot")
	// ErrReplacedTooOften: Register refused a registration that would have
	// replaced the node's current one, which has been replaced too often
	// lately (Options.ReplaceBurst, Options.ReplaceEvery).
	ErrReplacedTooOften = errors.New("node re-registered too often")
)

// Reason returns the refusal reason label for an error from Open.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrNoTunnel):
		return ReasonNoTunnel
	case errors.Is(err, ErrOverloaded):
		return ReasonOverloaded
	}
	return ReasonOpenFailed
}

// Conn is the part of *quic.Conn the registry uses.
type Conn interface {
	ConnectionState() quic.ConnectionState
	ConnectionStats() quic.ConnectionStats
	OpenStreamSync(context.Context) (*quic.Stream, error)
	CloseWithError(quic.ApplicationErrorCode, string) error
	Context() context.Context
	RemoteAddr() net.Addr
}

var _ Conn = (*quic.Conn)(nil)

// Options configure a Registry.
type Options struct {
	// MaxStreams is the number of concurrent streams per edge; 0 means
	// DefaultMaxStreams. Keep it at most the edge's own limit.
	MaxStreams int
	// OpenWait is how long Open waits for a free stream slot (and for the
	// edge to grant stream credit) before refusing with ErrOverloaded; 0
	// means DefaultOpenWait.
	OpenWait time.Duration
	// Logger receives registration logs; nil discards them.
	Logger *slog.Logger
	// ReplaceBurst is how many registrations of one node may replace its
	// current one in a row, one more per ReplaceEvery; 0 means
	// DefaultReplaceBurst and DefaultReplaceEvery.
	ReplaceBurst int
	ReplaceEvery time.Duration
	// Clock gives the replacement budget its time; nil means the real
	// clock.
	Clock clock.PassiveClock
}

// Registry maps node names to their edges' tunnels. It is safe for
// concurrent use.
type Registry struct {
	maxStreams int
	openWait   time.Duration
	log        *slog.Logger

	mu      sync.Mutex
	edges   map[string]*Edge // guarded by mu
	drained chan struct{}    // guarded by mu; closed and replaced when streams reach 0
	streams int64            // guarded by mu: open streams over all edges, gone ones included
	// Bytes of edges that are gone and have no stream left, so that the
	// totals stay monotonic across reconnections. Guarded by mu.
	goneUp, goneDown int64
	// Edges that are gone but still have open streams. Guarded by mu.
	draining map[*Edge]struct{}

	registered, replaced, refused atomic.Int64

	replaceBurst int
	replaceEvery time.Duration
	clock        clock.PassiveClock
	// churn is, per node that replaced a registration lately, its
	// replacement budget and log state. Guarded by mu.
	churn map[string]*churn

	// onWait, when set (by tests), is called when Open starts waiting
	// for a free stream slot.
	onWait func()
}

// New returns an empty Registry.
func New(opts Options) *Registry {
	r := &Registry{
		maxStreams: opts.MaxStreams,
		openWait:   opts.OpenWait,
		log:        opts.Logger,
		edges:      make(map[string]*Edge),
		drained:    make(chan struct{}),
		draining:   make(map[*Edge]struct{}),
	}
	if r.maxStreams <= 0 {
		r.maxStreams = DefaultMaxStreams
	}
	if r.openWait <= 0 {
		r.openWait = DefaultOpenWait
	}
	r.replaceBurst, r.replaceEvery, r.clock = opts.ReplaceBurst, opts.ReplaceEvery, opts.Clock
	if r.replaceBurst <= 0 || r.replaceEvery <= 0 {
		r.replaceBurst, r.replaceEvery = DefaultReplaceBurst, DefaultReplaceEvery
	}
	if r.clock == nil {
		r.clock = clock.RealClock{}
	}
	r.churn = make(map[string]*churn)
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	close(r.drained) // no streams yet
	return r
}

// Edge is one registered tunnel: a node's QUIC connection to this replica.
type Edge struct {
	node  string
	conn  Conn
	since time.Time
	reg   *Registry
	sem   chan struct{}

	streams          atomic.Int64
	bytesUp, bytesDn atomic.Int64 // toward the edge, from the edge

	mu       sync.Mutex
	refusals map[string]int64 // guarded by mu
	gone     bool             // guarded by reg.mu: no longer in reg.edges
	// replaced: a newer registration of the node took e's place while
	// streams were open on it; e's connection is closed with
	// tunnel.CloseReplaced when the last of them ends. Guarded by reg.mu.
	replaced bool
}

// Node is the node name from the edge's certificate.
func (e *Edge) Node() string { return e.node }

// Register adds conn, whose TLS handshake has completed, as the tunnel of
// the node its client certificate names. A previous registration of the
// same node is closed with tunnel.CloseReplaced, at once if no stream is
// open on it, else when its last stream ends: an edge that reconnects
// with a rotated certificate keeps the connections it relays, while new
// ones take the new tunnel. (A previous connection that is dead ends its
// streams within the QUIC idle timeout.) The error wraps
// tunnel.ErrNotANode when the certificate is not a node identity; the
// caller then closes conn (with tunnel.CloseNotAllowed).
func (r *Registry) Register(conn Conn) (*Edge, error) {
	certs := conn.ConnectionState().TLS.PeerCertificates
	if len(certs) == 0 {
		return nil, fmt.Errorf("register %v: %w: no client certificate", conn.RemoteAddr(), tunnel.ErrNotANode)
	}
	node, err := tunnel.NodeName(certs[0])
	if err != nil {
		return nil, fmt.Errorf("register %v: %w", conn.RemoteAddr(), err)
	}
	e := &Edge{
		node:     node,
		conn:     conn,
		since:    time.Now(),
		reg:      r,
		sem:      make(chan struct{}, r.maxStreams),
		refusals: make(map[string]int64),
	}
	now := r.clock.Now()
	r.mu.Lock()
	old := r.edges[node]
	var c *churn
	logIt, suppressed := false, 0
	if old != nil {
		c = r.churnLocked(node, now)
		if !c.take(now, r.replaceBurst, r.replaceEvery) {
			logIt, suppressed = c.logLine(now)
			r.mu.Unlock()
			r.refused.Add(1)
			if logIt {
				r.log.Warn("edge registration refused: node re-registered too often; is another machine using its certificate?", "node", node,
					"remote", conn.RemoteAddr().String(), "current_remote", old.conn.RemoteAddr().String(), "suppressed", suppressed)
			}
			return nil, fmt.Errorf("register %v as node %s: %w (the current registration is kept)", conn.RemoteAddr(), node, ErrReplacedTooOften)
		}
	}
	r.edges[node] = e
	closeOld := false
	var oldStreams int64
	if old != nil {
		r.dropLocked(old)
		oldStreams = old.streams.Load()
		closeOld = oldStreams == 0
		old.replaced = !closeOld
		logIt, suppressed = c.logLine(now)
	}
	r.mu.Unlock()
	r.registered.Add(1)
	if old != nil {
		r.replaced.Add(1)
		if logIt {
			r.log.Info("edge registration replaced", "node", node, "remote", conn.RemoteAddr().String(), "old_remote", old.conn.RemoteAddr().String(),
				"old_streams", oldStreams, "suppressed", suppressed)
		}
		if closeOld {
			old.closeReplaced()
		}
	}
	return e, nil
}

// churn is one node's replacement budget (a token bucket) and the state of
// its log lines.
type churn struct {
	tokens     float64
	at         time.Time // of the last refill
	nextLog    time.Time // when a line may be logged again
	suppressed int       // lines left out since the last one
}

// churnLocked returns node's churn, new with a full bucket if it has none.
// The map keeps only nodes whose bucket is not full again by now or whose
// log interval has not passed: it is swept when it outgrows the edges.
// r.mu must be held.
func (r *Registry) churnLocked(node string, now time.Time) *churn {
	c := r.churn[node]
	if c != nil {
		return c
	}
	if len(r.churn) >= 2*len(r.edges)+64 {
		full := time.Duration(r.replaceBurst) * r.replaceEvery
		for n, c := range r.churn {
			if now.Sub(c.at) >= full && !now.Before(c.nextLog) {
				delete(r.churn, n)
			}
		}
	}
	c = &churn{tokens: float64(r.replaceBurst), at: now}
	r.churn[node] = c
	return c
}

// take refills c's bucket for the time since its last refill and takes a
// token if there is one.
func (c *churn) take(now time.Time, burst int, every time.Duration) bool {
	if d := now.Sub(c.at); d > 0 {
		c.tokens = min(float64(burst), c.tokens+float64(d)/float64(every))
	}
	c.at = now
	if c.tokens < 1 {
		return false
	}
	c.tokens--
	return true
}

// logLine reports whether a line may be logged now and how many were left
// out before it.
func (c *churn) logLine(now time.Time) (bool, int) {
	if now.Before(c.nextLog) {
		c.suppressed++
		return false, 0
	}
	n := c.suppressed
	c.nextLog, c.suppressed = now.Add(ReplaceLogEvery), 0
	return true, n
}

// Unregister removes e if it is still the node's registration; it does not
// close e's connection. Unregistering an edge that was replaced, or twice,
// does nothing.
func (r *Registry) Unregister(e *Edge) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.edges[e.node] == e {
		delete(r.edges, e.node)
		r.dropLocked(e)
	}
}

// dropLocked marks e gone and folds its byte counts into the totals once its
// last stream is released. r.mu must be held.
func (r *Registry) dropLocked(e *Edge) {
	e.gone = true
	if e.streams.Load() == 0 {
		r.foldLocked(e)
	} else {
		r.draining[e] = struct{}{}
	}
}

func (r *Registry) foldLocked(e *Edge) {
	delete(r.draining, e)
	r.goneUp += e.bytesUp.Load()
	r.goneDown += e.bytesDn.Load()
}

// Lookup returns the node's current registration.
func (r *Registry) Lookup(node string) (*Edge, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.edges[node]
	return e, ok
}

// Len returns the number of registered edges.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.edges)
}

// Stream is a stream to an edge, holding one of the edge's stream slots
// until Release.
type Stream struct {
	*quic.Stream
	edge *Edge
	once sync.Once
}

// Open opens a stream to the node's edge. It waits up to Options.OpenWait
// for a free slot; the error wraps ErrNoTunnel or ErrOverloaded when the
// stream cannot be had for those reasons (see Reason). The caller must call
// Release on the returned stream when it is done with it.
func (r *Registry) Open(ctx context.Context, node string) (*Stream, error) {
	e, ok := r.Lookup(node)
	if !ok {
		return nil, fmt.Errorf("open stream to %s: %w", node, ErrNoTunnel)
	}
	s, err := e.open(ctx)
	if err != nil {
		return nil, fmt.Errorf("open stream to %s: %w", node, err)
	}
	return s, nil
}

func (e *Edge) open(ctx context.Context) (*Stream, error) {
	wait := e.reg.openWait
	if err := e.acquire(ctx, wait); err != nil {
		return nil, err
	}
	e.reg.addStreams(e, 1)
	octx, cancel := context.WithTimeout(ctx, wait)
	qs, err := e.conn.OpenStreamSync(octx)
	cancel()
	if err != nil {
		e.release()
		switch {
		case e.conn.Context().Err() != nil:
			return nil, fmt.Errorf("%w: connection closed: %w", ErrNoTunnel, context.Cause(e.conn.Context()))
		case ctx.Err() != nil:
			return nil, context.Cause(ctx)
		case errors.Is(err, context.DeadlineExceeded):
			e.Refused(ReasonOverloaded)
			return nil, fmt.Errorf("%w: no stream credit from the edge within %s", ErrOverloaded, wait)
		}
		return nil, err
	}
	return &Stream{Stream: qs, edge: e}, nil
}

func (e *Edge) acquire(ctx context.Context, wait time.Duration) error {
	select {
	case e.sem <- struct{}{}:
		return nil
	default:
	}
	if h := e.reg.onWait; h != nil {
		h()
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case e.sem <- struct{}{}:
		return nil
	case <-t.C:
		e.Refused(ReasonOverloaded)
		return fmt.Errorf("%w: %d streams busy for %s", ErrOverloaded, cap(e.sem), wait)
	case <-e.conn.Context().Done():
		return fmt.Errorf("%w: connection closed: %w", ErrNoTunnel, context.Cause(e.conn.Context()))
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (e *Edge) release() {
	<-e.sem
	e.reg.addStreams(e, -1)
}

// addStreams changes the open stream counts of e and of the registry, and
// folds a gone edge's bytes into the totals when its last stream ends.
func (r *Registry) addStreams(e *Edge, delta int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := e.streams.Add(delta)
	if r.streams == 0 && delta > 0 {
		r.drained = make(chan struct{})
	}
	r.streams += delta
	if r.streams == 0 {
		close(r.drained)
	}
	if n == 0 && e.gone {
		if _, ok := r.draining[e]; ok {
			r.foldLocked(e)
		}
		if e.replaced {
			e.replaced = false
			go e.closeReplaced() // it waits for the connection to end
		}
	}
}

// closeReplaced closes the connection of a registration that a newer one
// of the same node replaced.
func (e *Edge) closeReplaced() {
	e.conn.CloseWithError(tunnel.CloseReplaced, "replaced by a newer connection of node "+e.node)
}

// Node is the node the stream leads to.
func (s *Stream) Node() string { return s.edge.node }

// Edge is the registration the stream belongs to.
func (s *Stream) Edge() *Edge { return s.edge }

// RelayOptions returns options for tunnel.Relay that count the relayed bytes
// on the stream's edge.
func (s *Stream) RelayOptions(idle time.Duration) tunnel.RelayOptions {
	return tunnel.RelayOptions{Idle: idle, ToStream: &s.edge.bytesUp, FromStream: &s.edge.bytesDn}
}

// Release frees the stream's slot. It does not close the stream (Relay
// does); call it after the stream is finished with. Calls after the first
// do nothing.
func (s *Stream) Release() { s.once.Do(s.edge.release) }

// Refused counts a refusal of the given reason (a tunnel.Code name or one
// of the Reason constants) on the edge.
func (e *Edge) Refused(reason string) {
	e.mu.Lock()
	e.refusals[reason]++
	e.mu.Unlock()
}

// Drain waits until no stream is open on any edge, or ctx is done.
func (r *Registry) Drain(ctx context.Context) error {
	for {
		r.mu.Lock()
		n, ch := r.streams, r.drained
		r.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("drain: %d streams still open: %w", n, context.Cause(ctx))
		}
	}
}

// EdgeStatus is what the registry knows about one edge at one moment.
type EdgeStatus struct {
	Node           string
	Remote         string // the connection's current path
	ConnectedSince time.Time
	RTT            time.Duration // smoothed
	Streams        int64
	BytesUp        int64 // toward the edge
	BytesDown      int64 // from the edge
	Refusals       map[string]int64
}

// Status returns the edge's current figures.
func (e *Edge) Status() EdgeStatus {
	e.mu.Lock()
	var ref map[string]int64
	if len(e.refusals) > 0 {
		ref = maps.Clone(e.refusals)
	}
	e.mu.Unlock()
	return EdgeStatus{
		Node:           e.node,
		Remote:         e.conn.RemoteAddr().String(),
		ConnectedSince: e.since,
		RTT:            e.conn.ConnectionStats().SmoothedRTT,
		Streams:        e.streams.Load(),
		BytesUp:        e.bytesUp.Load(),
		BytesDown:      e.bytesDn.Load(),
		Refusals:       ref,
	}
}

// Edges returns the status of every registered edge, sorted by node name.
func (r *Registry) Edges() []EdgeStatus {
	r.mu.Lock()
	edges := slices.Collect(maps.Values(r.edges))
	r.mu.Unlock()
	out := make([]EdgeStatus, 0, len(edges))
	for _, e := range edges {
		out = append(out, e.Status())
	}
	slices.SortFunc(out, func(a, b EdgeStatus) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// Totals returns the bytes relayed toward and from all edges since the
// registry was created, reconnections included.
func (r *Registry) Totals() (up, down int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	up, down = r.goneUp, r.goneDown
	for _, e := range r.edges {
		up += e.bytesUp.Load()
		down += e.bytesDn.Load()
	}
	for e := range r.draining {
		up += e.bytesUp.Load()
		down += e.bytesDn.Load()
	}
	return up, down
}
