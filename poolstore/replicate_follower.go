package poolstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/ticker"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/replica"
)

// FollowerOptions configure a Follower. PeerConfig, Store and Leader are
// required.
type FollowerOptions struct {
	PeerConfig
	// Store is this node's replica.
	Store *replica.Store
	// Verifier checks what the leader relays against the gateways'
	// certificates (replicate_verify.go); its chains are seeded from the
	// store's at NewFollower.
	Verifier *feed.Verifier
	// Leader is the pool's leader as this node sees it ("" if unknown):
	// from the election, or from peers (Client.AskLeader) when the cloud
	// is out of reach. It is polled every CheckInterval and must not
	// block. The Follower idles while it is "" or Self.
	Leader func() string
	// CheckInterval is how often Leader is polled. Default 1 s.
	CheckInterval time.Duration
	// StaleAfter ends a stream without a frame for this long (the leader
	// sends one every ServerOptions.SyncEvery at least). Default 20 s.
	StaleAfter time.Duration
	// Reconnect backoff: from BackoffInitial (200 ms), doubling up to
	// BackoffMax (30 s), jittered; it starts over after a stream lived
	// BackoffReset (1 min) or when the leader changes.
	BackoffInitial, BackoffMax, BackoffReset time.Duration
	// MaxObjects and MaxBytes (of the objects' JSON) bound what a leader
	// can make this node hold: a snapshot larger, or changes that could
	// take the replica past either, end the stream, and the replica stays
	// as it was (not replaced by a part of the snapshot). Defaults 100,000
	// objects and 256 MiB: the default resources of a cluster at
	// Kubernetes' scalability limits (10,000 Services, 150,000 Pods behind
	// them) are about 32,000 objects and 110 MB (an endpoint is ~280
	// bytes in an EndpointSlice and ~190 in Endpoints, a Service 1.5 KB,
	// managedFields included).
	MaxObjects int
	MaxBytes   int64
	// MaxSyncAhead: a signed mark whose time is later than this node's
	// clock plus this ends the stream (a gateway's clock far ahead would
	// keep the replica fresh for long). Gateway and node clocks must
	// agree within it. Default 1 min.
	MaxSyncAhead time.Duration
	// Registerer, if set, gets the follower's metrics.
	Registerer prometheus.Registerer
}

// Follower replicates the leader's store into this node's: it streams
// from the leader, reconnecting with backoff when the stream ends or the
// leader changes.
type Follower struct {
	o      FollowerOptions
	client *Client
	log    *slog.Logger
	m      *followerMetrics

	// wantSnapshot asks the next stream for a snapshot (after a gap).
	// Only Run's goroutine uses it.
	wantSnapshot bool
	// refusedLeader is the leader and reason last refused for its
	// membership (logged and counted once); "" once a stream opened. Only
	// Run's goroutine uses it.
	refusedLeader string
	// loggedRefusal is when a refusal of a stream was last logged, by
	// leader and reason. Only Run's goroutine uses it.
	loggedRefusal map[string]time.Time

	mu sync.Mutex
	st statusapi.Replication // what it is doing, /status's replication
}

// Why a follower ends a stream itself.
var (
	errLeaderChanged = errors.New("the pool leader changed")
	errStale         = errors.New("no frame from the leader for too long")
)

// Defaults of FollowerOptions' bounds of the replica.
const (
	DefaultMaxObjects = 100_000
	DefaultMaxBytes   = 256 << 20
)

// Reasons a follower refuses a leader, the "reason" label of
// tether_edge_pool_leaders_refused_total, besides the membership reasons
// of peers_refused_total (refusedUnknownNode: Members does not know the
// leader's pool; refusedOtherPool; refusedNoPool: this node's own pool is
// unknown), for which it does not connect.
const (
	refusedTooManyObjects = "too_many_objects" // the replica would pass MaxObjects
	refusedTooLarge       = "too_large"        // the replica would pass MaxBytes
	refusedSyncInFuture   = "sync_in_future"   // a sync mark ahead of this node's clock
)

var leaderRefusalReasons = []string{refusedUnknownNode, refusedOtherPool, refusedNoPool,
	refusedTooManyObjects, refusedTooLarge, refusedSyncInFuture, refusedUnsigned, refusedUnknownKey,
	refusedBadSignature, refusedBadChain, refusedRootMismatch, refusedRollback}

// NewFollower checks o and registers the metrics; Run does the work.
func NewFollower(o FollowerOptions) (*Follower, error) {
	if o.Store == nil || o.Leader == nil || o.Verifier == nil {
		return nil, errors.New("pool follower: Store, Leader and Verifier are required")
	}
	client, err := NewClient(o.PeerConfig)
	if err != nil {
		return nil, err
	}
	o.PeerConfig = client.cfg
	o.CheckInterval = cmpOr(o.CheckInterval, time.Second)
	o.StaleAfter = cmpOr(o.StaleAfter, 20*time.Second)
	o.BackoffInitial = cmpOr(o.BackoffInitial, 200*time.Millisecond)
	o.BackoffMax = cmpOr(o.BackoffMax, 30*time.Second)
	o.BackoffReset = cmpOr(o.BackoffReset, time.Minute)
	if o.MaxObjects <= 0 {
		o.MaxObjects = DefaultMaxObjects
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	o.MaxSyncAhead = cmpOr(o.MaxSyncAhead, time.Minute)
	f := &Follower{o: o, client: client, log: o.Logger, loggedRefusal: map[string]time.Time{}}
	if f.m, err = newFollowerMetrics(o.Registerer); err != nil {
		return nil, fmt.Errorf("pool follower metrics: %w", err)
	}
	// The chains the replica was verified with, so that what it holds
	// verifies again after a restart with no gateway in reach.
	(&verifier{f: f}).trust(o.Store.Chains())
	return f, nil
}

// Client is the follower's client to its peers (AskLeader).
func (f *Follower) Client() *Client { return f.client }

// DelegateToLeader sends this node's own node Lease to the leader (see
// Client.SendHeartbeat).
func (f *Follower) DelegateToLeader(ctx context.Context, lease []byte) error {
	switch leader := f.o.Leader(); leader {
	case "":
		return errors.New("delegate heartbeat: no pool leader known")
	case f.o.Self:
		return errors.New("delegate heartbeat: this node is the leader")
	default:
		if err := f.checkLeader(leader); err != nil {
			return fmt.Errorf("delegate heartbeat: %w", err)
		}
		return f.client.SendHeartbeat(ctx, leader, lease)
	}
}

// checkLeader refuses (a *refusal) a leader that Members does not place
// in this node's own pool.
func (f *Follower) checkLeader(leader string) error {
	own, ok := f.o.Members.Pool(f.o.Self)
	if !ok {
		return &refusal{refusedNoPool, fmt.Errorf("this node's pool is unknown: not following %s", leader)}
	}
	theirs, ok := f.o.Members.Pool(leader)
	switch {
	case !ok:
		return &refusal{refusedUnknownNode, fmt.Errorf("leader %s is no known member of a pool", leader)}
	case theirs != own:
		return &refusal{refusedOtherPool, fmt.Errorf("leader %s is in pool %q, this node in %q", leader, theirs, own)}
	}
	return nil
}

// Status is a copy of the follower's status.
func (f *Follower) Status() statusapi.Replication {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.st
	st.Rev = f.o.Store.Rev()
	st.Lag = f.lag(st.LeaderRev)
	return st
}

// lag is leaderRev minus the replica's revision, 0 if not above.
func (f *Follower) lag(leaderRev uint64) uint64 {
	if rev := f.o.Store.Rev(); leaderRev > rev {
		return leaderRev - rev
	}
	return 0
}

// Run follows the leader until ctx ends.
func (f *Follower) Run(ctx context.Context) error {
	defer f.client.Close()
	template := wait.Backoff{Duration: f.o.BackoffInitial, Factor: 2, Jitter: 0.5, Steps: 64, Cap: f.o.BackoffMax}
	bo := template
	var last string
	for {
		leader := f.o.Leader()
		if leader == "" || leader == f.o.Self {
			if !ticker.Sleep(ctx, f.o.Clock, f.o.CheckInterval) {
				return nil
			}
			continue
		}
		if leader != last {
			bo, last = template, leader
		}
		if err := f.checkLeader(leader); err != nil {
			f.refused(leader, err)
			if !ticker.Sleep(ctx, f.o.Clock, f.o.CheckInterval) {
				return nil
			}
			continue
		}
		started := f.o.Clock.Now()
		err := f.follow(ctx, leader)
		if ctx.Err() != nil {
			return nil
		}
		if f.o.Clock.Since(started) >= f.o.BackoffReset || errors.Is(err, errLeaderChanged) {
			bo = template
		}
		f.setError(err)
		f.refused(leader, err)
		d := bo.Step()
		f.log.Info("pool replication stream ended; reconnecting", "leader", leader, "err", err, "in", d)
		if !ticker.Sleep(ctx, f.o.Clock, d) {
			return nil
		}
	}
}

// follow streams from leader into the store until the stream ends, the
// leader changes or the stream goes stale.
func (f *Follower) follow(ctx context.Context, leader string) error {
	ctx, cancel := context.WithCancelCause(ctx)
	epoch, rev := f.o.Store.Epoch(), f.o.Store.Rev()
	if f.wantSnapshot {
		epoch, rev = "", 0
	}
	resp, err := f.client.replicate(ctx, leader, epoch, rev)
	if err != nil {
		cancel(nil)
		return err
	}
	f.connected(leader)
	f.log.Info("pool replication stream open", "leader", leader, "epoch", epoch, "rev", rev)
	var wg sync.WaitGroup
	wg.Go(func() { f.watch(ctx, cancel, leader) })
	defer func() {
		cancel(nil)
		resp.Body.Close()
		wg.Wait()
		f.disconnected()
	}()
	err = f.apply(newFrameReader(resp.Body))
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause // why watch ended it
	}
	return err
}

// watch ends the stream (cancel) when the leader changes or no frame came
// for StaleAfter.
func (f *Follower) watch(ctx context.Context, cancel context.CancelCauseFunc, leader string) {
	ticker.Every(ctx, f.o.Clock, f.o.CheckInterval, func() bool {
		if now := f.o.Leader(); now != leader {
			cancel(fmt.Errorf("%w: from %s to %q", errLeaderChanged, leader, now))
			return false
		}
		if err := f.checkLeader(leader); err != nil {
			cancel(err)
			return false
		}
		f.mu.Lock()
		last := f.st.LastFrame
		f.mu.Unlock()
		if f.o.Clock.Since(last) > f.o.StaleAfter {
			cancel(fmt.Errorf("%w (%s)", errStale, f.o.StaleAfter))
			return false
		}
		return true
	})
}

// apply reads frames and applies them to the store until the stream ends
// or a frame cannot be applied or is refused (a *refusal).
func (f *Follower) apply(r *frameReader) error {
	store := f.o.Store
	v := &verifier{f: f}
	var snap *replica.Snapshot // being received
	var want int               // its number of objects
	var size int64             // and of bytes so far
	for {
		fr, n, err := r.next()
		if errors.Is(err, io.EOF) {
			return errors.New("the leader ended the stream")
		}
		if err != nil {
			return err
		}
		f.received(fr, n)
		switch fr.Type {
		case frameSnapshot:
			if fr.Count < 0 {
				return fmt.Errorf("protocol error: a snapshot of %d objects", fr.Count)
			}
			if fr.Count > f.o.MaxObjects {
				return &refusal{refusedTooManyObjects, fmt.Errorf("a snapshot of %d objects, more than %d", fr.Count, f.o.MaxObjects)}
			}
			snap = &replica.Snapshot{Epoch: fr.Epoch, Rev: fr.Rev, Resources: fr.Resources,
				Objects: make([]replica.Change, 0, min(fr.Count, 1<<16)), Attests: fr.Attests, Mark: fr.Mark, Chains: fr.Chains}
			v.pending = v.pending[:0]
			want, size = fr.Count, 0
		case frameObjects:
			if snap == nil || len(snap.Objects)+len(fr.Items) > want {
				return errors.New("protocol error: objects beyond a snapshot")
			}
			if size += objectBytes(fr.Items); size > f.o.MaxBytes {
				return &refusal{refusedTooLarge, fmt.Errorf("a snapshot of more than %d bytes of objects", f.o.MaxBytes)}
			}
			snap.Objects = append(snap.Objects, fr.Items...)
		case frameChanges:
			if snap != nil {
				return errors.New("protocol error: changes inside a snapshot")
			}
			if err := v.changes(fr.Epoch, fr.Items); err != nil {
				return err
			}
		case frameSync:
			if err := v.syncMark(fr.Mark); err != nil {
				return err
			}
		case frameTrust:
			v.trust(fr.Chains)
		default:
			f.log.Debug("pool replication: frame of unknown type skipped", "type", fr.Type)
		}
		if snap != nil && len(snap.Objects) == want {
			if err := v.snapshot(snap); err != nil {
				f.wantSnapshot = false // the same snapshot again would be refused again
				return err
			}
			if err := store.Load(*snap); err != nil {
				return fmt.Errorf("load snapshot: %w", err)
			}
			f.loaded(snap)
			if err := v.syncMark(snap.Mark); err != nil {
				return err
			}
			snap = nil
		}
		f.m.lag.Set(float64(f.lag(fr.Rev)))
	}
}

// checkGrowth refuses changes that could take the replica past
// MaxObjects or MaxBytes (counting each Added and Modified object as
// new: a frame's worth above the real growth at most).
func (f *Follower) checkGrowth(cs []replica.Change) error {
	var objs int
	for _, c := range cs {
		if c.Type == replica.Added || c.Type == replica.Modified {
			objs++
		}
	}
	if n := f.o.Store.Len() + objs; n > f.o.MaxObjects {
		return &refusal{refusedTooManyObjects, fmt.Errorf("changes that could take the replica to %d objects, more than %d", n, f.o.MaxObjects)}
	}
	if n := f.o.Store.Bytes() + objectBytes(cs); n > f.o.MaxBytes {
		return &refusal{refusedTooLarge, fmt.Errorf("changes that could take the replica to %d bytes of objects, more than %d", n, f.o.MaxBytes)}
	}
	return nil
}

// objectBytes is the size of the objects in cs.
func objectBytes(cs []replica.Change) int64 {
	var n int64
	for _, c := range cs {
		n += int64(len(c.Object))
	}
	return n
}

// refused counts and logs err if it is a refusal of leader: a stream
// refused each time, a leader's membership once until a stream opens.
func (f *Follower) refused(leader string, err error) {
	r, ok := errors.AsType[*refusal](err)
	if !ok {
		return
	}
	switch r.reason {
	case refusedUnknownNode, refusedOtherPool, refusedNoPool:
		f.setError(err)
		if key := leader + "\x00" + r.reason; key != f.refusedLeader {
			f.refusedLeader = key
			f.m.refused.WithLabelValues(r.reason).Inc()
			f.log.Warn("pool leader refused: not a member of this node's pool; not replicating from it", "leader", leader, "reason", r.reason, "err", r.err)
		}
	default:
		f.m.refused.WithLabelValues(r.reason).Inc()
		// A leader that keeps sending what is refused is refused at each
		// reconnection: logged once a minute per leader and reason.
		key, now := leader+"\x00"+r.reason, f.o.Clock.Now()
		if last, ok := f.loggedRefusal[key]; ok && now.Sub(last) < time.Minute {
			return
		}
		if len(f.loggedRefusal) > 64 {
			clear(f.loggedRefusal)
		}
		f.loggedRefusal[key] = now
		f.log.Warn("pool replication stream refused; the replica keeps what it had", "leader", leader, "reason", r.reason, "err", r.err)
	}
}

// received records a frame in the status and the metrics.
func (f *Follower) received(fr frame, n int) {
	f.m.frames.WithLabelValues(fr.Type).Inc()
	f.m.bytes.Add(float64(n))
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.LastFrame = f.o.Clock.Now()
	f.st.LeaderRev = fr.Rev
}

func (f *Follower) loaded(snap *replica.Snapshot) {
	f.wantSnapshot = false
	f.m.resyncs.Inc()
	f.log.Info("pool replica loaded from a snapshot", "leader_epoch", snap.Epoch, "rev", snap.Rev, "objects", len(snap.Objects))
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.Resyncs++
}

func (f *Follower) connected(leader string) {
	f.refusedLeader = ""
	f.m.connected.Set(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.Leader, f.st.Connected, f.st.LastFrame, f.st.LastError = leader, true, f.o.Clock.Now(), ""
}

func (f *Follower) disconnected() {
	f.m.connected.Set(0)
	f.m.lag.Set(0)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.Leader, f.st.Connected = "", false
}

func (f *Follower) setError(err error) {
	if err == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.LastError = err.Error()
}
