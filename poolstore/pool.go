package poolstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/ticker"
	"github.com/tether-edge/tether/poolstore/elect"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/poolstore/replica"
	"github.com/tether-edge/tether/poolstore/serve"
)

// DefaultFreshFor is how old the leader's last sync may be for a replica
// to answer reads while the cloud is reachable (docs/design.md, "The node
// pool").
const DefaultFreshFor = 30 * time.Second

// Options configure a Pool. PeerConfig, Pool, Client, Store, Listener
// and CloudHealthy are required.
type Options struct {
	PeerConfig
	// Pool is the pool's name (the nodes' openyurt.PoolLabel value).
	Pool string
	// Client reaches the cloud apiserver with the node's identity: it
	// reads the election and sync records.
	Client *kube.Client
	// Records writes the election and sync records on this node's behalf
	// (tether-edge: the gateway, through the tunnel), and Feed opens the
	// gateway's signed pool feed, which the leader relays (FeedSource).
	// Without both this node never campaigns and follows the leader the
	// others elect; a node identity may only read the records
	// (pool-rbac.yaml).
	Records record.Writer
	Feed    func(ctx context.Context) (io.ReadCloser, error)
	// Verifier checks what the gateway signed, as leader and as follower.
	Verifier *feed.Verifier
	// Resources are the pool-scope resources (default DefaultResources).
	Resources []schema.GroupVersionResource
	Store     *replica.Store
	// Listener is the pool listener (TLS is added).
	Listener net.Listener
	// CloudHealthy reports whether this node reaches the cloud now: while
	// it does, the leader is the one the election shows; while it does
	// not, the one its peers name.
	CloudHealthy func() bool
	// Peers lists the pool's members, to ask who leads when the cloud is
	// out of reach.
	Peers func() []string
	// Delegate passes a member's Lease renewal to the cloud (the gateway,
	// through the tunnel); nil: heartbeats are not delegated.
	Delegate func(ctx context.Context, node string, lease []byte) error
	// Election timings (default 15 s, 10 s, 2 s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// FreshFor: see DefaultFreshFor.
	FreshFor   time.Duration
	Registerer prometheus.Registerer
}

// Pool is this node's part of its node pool: it campaigns for the lead;
// while it leads it fills its store from the cloud and serves it to the
// members; otherwise it replicates the leader's store. It serves its
// replica to the node's components (Transport) and passes the node's
// heartbeats to the leader when the cloud is out of reach.
type Pool struct {
	o        Options
	log      *slog.Logger
	elector  *elect.Elector
	server   *Server
	follower *Follower
	handler  *serve.Handler
	rt       http.RoundTripper
	m        *poolMetrics

	mu       sync.Mutex
	termOpen bool   // this node leads and its term's epoch is started
	hint     string // the leader a peer named while the cloud was out of reach
}

// New checks o and builds the Pool; Run runs it.
func New(o Options) (*Pool, error) {
	if o.Pool == "" || o.Client == nil || o.Store == nil || o.Listener == nil || o.CloudHealthy == nil || o.Verifier == nil {
		return nil, errors.New("pool: Pool, Client, Store, Listener, CloudHealthy and Verifier are required")
	}
	cfg, err := o.PeerConfig.withDefaults()
	if err != nil {
		return nil, err
	}
	o.PeerConfig = cfg
	o.Logger = o.Logger.With("pool", o.Pool)
	if o.FreshFor <= 0 {
		o.FreshFor = DefaultFreshFor
	}
	if len(o.Resources) == 0 {
		o.Resources = DefaultResources
	}
	if o.Peers == nil {
		o.Peers = func() []string { return nil }
	}
	p := &Pool{o: o, log: o.Logger}
	if p.elector, err = elect.New(elect.Options{Client: o.Client, Records: o.Records, FollowOnly: !p.campaigns(), Pool: o.Pool, Node: o.Self,
		LeaseDuration: o.LeaseDuration, RenewDeadline: o.RenewDeadline, RetryPeriod: o.RetryPeriod, Logger: p.log}); err != nil {
		return nil, err
	}
	if p.server, err = NewServer(ServerOptions{PeerConfig: o.PeerConfig, Store: o.Store, Leader: p.Leader,
		Delegate: o.Delegate, Registerer: o.Registerer}); err != nil {
		return nil, err
	}
	if p.follower, err = NewFollower(FollowerOptions{PeerConfig: o.PeerConfig, Store: o.Store, Leader: p.Leader,
		Verifier: o.Verifier, Registerer: o.Registerer}); err != nil {
		return nil, err
	}
	p.handler = serve.New(o.Store, serve.Options{Logger: p.log})
	p.rt = serve.Transport(p.handler)
	if p.m, err = newPoolMetrics(o.Registerer, p); err != nil {
		return nil, fmt.Errorf("pool metrics: %w", err)
	}
	return p, nil
}

// Run runs the election, the pool listener, the replication and the
// search for the leader until ctx ends.
func (p *Pool) Run(ctx context.Context) error {
	p.log.Info("node pool", "listen", p.o.Listener.Addr().String(), "resources", len(p.o.Resources),
		"replica", p.o.Store.Path(), "objects", p.o.Store.Len(), "campaigns", p.campaigns())
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.elector.Run(ctx, p.lead) })
	g.Go(func() error { return p.server.Serve(ctx, p.o.Listener) })
	g.Go(func() error { return p.follower.Run(ctx) })
	g.Go(func() error { p.findLeader(ctx); return nil })
	return g.Wait()
}

// campaigns reports whether this node may lead: it needs the gateway to
// write its records and to feed it.
func (p *Pool) campaigns() bool { return p.o.Records != nil && p.o.Feed != nil }

// lead is this node's term: a new epoch, then the gateway's signed feed
// into the store until the lease is lost.
func (p *Pool) lead(ctx context.Context) {
	epoch := fmt.Sprintf("%s/%d", p.o.Self, time.Now().UnixNano())
	if err := p.o.Store.StartEpoch(epoch); err != nil {
		p.log.Error("pool term not started", "err", err)
		return
	}
	p.setTermOpen(true)
	defer p.setTermOpen(false)
	p.log.Info("pool term started", "epoch", epoch)
	NewFeedSource(FeedSourceOptions{Open: p.o.Feed, Verifier: p.o.Verifier, Store: p.o.Store,
		Client: p.o.Client, Records: p.o.Records, Pool: p.o.Pool, Node: p.o.Self, Logger: p.log}).Run(ctx)
}

func (p *Pool) setTermOpen(open bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.termOpen = open
}

// Leader is the pool's leader as this node sees it: itself during its
// term; the election's holder while the cloud is reachable; otherwise the
// one its peers name, or the last holder it saw.
func (p *Pool) Leader() string {
	p.mu.Lock()
	term, hint := p.termOpen, p.hint
	p.mu.Unlock()
	if term {
		return p.o.Self
	}
	leader, _ := p.elector.Leader()
	if leader == p.o.Self {
		return "" // elected, term not started yet (or just ended)
	}
	if hint != "" && !p.o.CloudHealthy() {
		return hint
	}
	return leader
}

// findLeaderEvery is how often a node that reaches neither the cloud nor
// its leader asks its peers who leads.
const findLeaderEvery = 2 * time.Second

// findLeader asks the peers who leads while the cloud is out of reach and
// the replication stream is down: a peer that says it leads itself, with
// the newest sync, is followed.
func (p *Pool) findLeader(ctx context.Context) {
	ticker.Every(ctx, nil, findLeaderEvery, func() bool {
		p.askPeersForLeader(ctx)
		return true
	})
}

// askPeersForLeader is one round of findLeader.
func (p *Pool) askPeersForLeader(ctx context.Context) {
	if p.o.CloudHealthy() {
		p.setHint("")
		return
	}
	if p.follower.Status().Connected || p.Leader() == p.o.Self {
		return
	}
	var best LeaderInfo
	var bestAt time.Time
	for _, node := range p.o.Peers() {
		if node == p.o.Self {
			continue
		}
		info, err := p.follower.Client().AskLeader(ctx, node)
		if err != nil || info.Leader != info.Node {
			continue
		}
		// Ranked by its signed mark, not the time it states: a peer
		// cannot claim the newest replica (an unsigned, unverifiable or
		// future mark ranks last).
		at := p.verifiedMark(info)
		if best.Node == "" || at.After(bestAt) {
			best, bestAt = info, at
		}
	}
	if best.Node != "" {
		p.setHint(best.Node)
	}
}

// verifiedMark is the time of the signed mark a peer's answer carries,
// zero unless it verifies and is not ahead of this node's clock by more
// than MaxSyncAhead.
func (p *Pool) verifiedMark(info LeaderInfo) time.Time {
	h, err := openSigned(p.o.Verifier, info.Mark, feed.KindMark)
	if err != nil || h.T.After(time.Now().Add(p.follower.o.MaxSyncAhead)) {
		return time.Time{}
	}
	return h.T
}

func (p *Pool) setHint(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hint != node && node != "" {
		p.log.Info("pool leader named by a peer (the cloud is out of reach)", "leader", node)
	}
	p.hint = node
}

// Serves reports whether a list or watch of gvr is answered from the
// replica now: while the leader's last sync is at most FreshFor old, or,
// with the cloud out of reach, whenever the replica has the resource.
func (p *Pool) Serves(gvr schema.GroupVersionResource, cloudHealthy bool) bool {
	if !p.handler.Serves(replica.ResourceKey(gvr)) {
		return false
	}
	return !cloudHealthy || p.Fresh()
}

// Fresh reports whether the leader's last sync is at most FreshFor old.
func (p *Pool) Fresh() bool {
	at := p.o.Store.SyncedAt()
	return !at.IsZero() && time.Since(at) <= p.o.FreshFor
}

// Transport answers kube-apiserver list and watch requests of pool-scope
// resources from the replica.
func (p *Pool) Transport() http.RoundTripper { return p.rt }

// DelegateHeartbeat has this node's Lease (JSON) written in the cloud by
// way of the leader; a leader passes its own on itself.
func (p *Pool) DelegateHeartbeat(ctx context.Context, lease []byte) error {
	if p.Leader() == p.o.Self {
		if p.o.Delegate == nil {
			return errors.New("delegate heartbeat: no way to the gateway")
		}
		return p.o.Delegate(ctx, p.o.Self, lease)
	}
	return p.follower.DelegateToLeader(ctx, lease)
}

// Status reports the pool's state, its part of the edge's /status.
func (p *Pool) Status() statusapi.Pool {
	st := statusapi.Pool{Pool: p.o.Pool, Leader: p.Leader(), Epoch: p.o.Store.Epoch(), Rev: p.o.Store.Rev(),
		Objects: p.o.Store.Len(), SyncedAt: p.o.Store.SyncedAt(), Fresh: p.Fresh(), Digest: p.o.Store.Digest()}
	if st.Role = p.roleOf(st.Leader); st.Role == "follower" {
		fs := p.follower.Status()
		st.Replication = &fs
	}
	return st
}

// roleOf is this node's role when leader leads: leader, follower, or none
// (no leader known).
func (p *Pool) roleOf(leader string) string {
	switch leader {
	case "":
		return "none"
	case p.o.Self:
		return "leader"
	default:
		return "follower"
	}
}
