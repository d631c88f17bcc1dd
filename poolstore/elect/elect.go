// Package elect is a node pool's leader election: client-go's, on the
// narrow client (internal/kube) and on the pool's election record
// (poolstore/record), which nodes read and a record.Writer writes on
// their behalf. poolstore's Pool runs an Elector; whoever holds the
// record leads the pool.
package elect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/ticker"
	"github.com/tether-edge/tether/poolstore/record"
)

// Options configure an Elector. The durations default to 15 s,
// 10 s and 2 s (client-go's leader election defaults); LeaseDuration must
// exceed RenewDeadline, and RenewDeadline RetryPeriod*1.2, as client-go
// requires.
type Options struct {
	// Client reaches the cloud apiserver with the node's identity: it
	// reads the record.
	Client *kube.Client
	// Records writes the record on this node's behalf (tether-edge: the
	// gateway, through the tunnel). nil: Client writes it, which needs
	// RBAC that the shipped pool-rbac.yaml does not give nodes.
	Records record.Writer
	// FollowOnly makes an Elector that only reads the record, to know the
	// leader, and never campaigns: a node with no way to write it.
	FollowOnly bool
	Pool       string
	// Node is this node's name: its identity in the record.
	Node string
	// LeaseDuration is how long a record must stay unchanged, by this
	// node's clock, before this node takes it from its holder.
	LeaseDuration time.Duration
	// RenewDeadline is how long the leader tries to renew before it stops
	// leading.
	RenewDeadline time.Duration
	// RetryPeriod is the time between tries (to take the record: jittered
	// up to 2.2 times as long; to renew it).
	RetryPeriod time.Duration
	Logger      *slog.Logger
}

// jitterFactor is client-go leaderelection's JitterFactor: a candidate
// waits RetryPeriod to RetryPeriod*(1+jitterFactor) between tries.
const jitterFactor = 1.2

// Elector runs the pool's leader election on the record
// record.Namespace/record.ElectionName(pool) in the cloud: only a node that reaches
// the cloud can hold it. See lock.go for why the record is a ConfigMap.
//
// It is client-go's leader election (tools/leaderelection), on the same
// record and with the same rules, written here because client-go's
// imports the clientset, which tether-edge does not carry (internal/kube):
//
//   - A candidate takes the record when it names no holder, or when it
//     has not changed for its leaseDurationSeconds since this node last
//     saw it change, by this node's clock: never by the record's
//     renewTime, which another node's clock wrote. It tries every
//     RetryPeriod, jittered.
//   - Every write carries the resourceVersion of the ConfigMap it is
//     based on: of two candidates that take the record at once, one
//     fails with a conflict.
//   - leaderTransitions counts the changes of holder; acquireTime is kept
//     while the holder renews.
//   - The leader renews every RetryPeriod; when no renewal has succeeded
//     for RenewDeadline it stops leading and campaigns again.
//   - When Run's context ends while this node leads, the record is
//     released (no holder, leaseDurationSeconds 1): another node takes it
//     at its next try. Unlike client-go, that happens once lead has
//     returned, and only if the record still names this node.
//
// The record is read with the node's identity and written by a
// record.Writer (Options.Records; see lock.go for why nodes do not
// write it themselves). With FollowOnly the Elector reads the record at
// every try, to know the leader, and never writes it.
type Elector struct {
	o     Options
	lock  *recordLock
	clock clock.Clock

	// The record as this campaign saw it (Run's alone): observedTime is
	// when, by e.clock, it was last seen to change; reported the holder
	// last reported to Leader.
	observed     record.Election
	observedRaw  []byte
	observedTime time.Time
	reported     string

	mu      sync.Mutex
	leader  string
	leading bool
	changed chan struct{}
}

// NewElector checks o and returns an Elector; Run runs it.
func New(o Options) (*Elector, error) {
	if o.Client == nil {
		return nil, errors.New("pool election: Client, Pool and Node are required")
	}
	cms := o.Client.ConfigMaps(record.Namespace)
	w := o.Records
	if w == nil {
		w = record.ClientWriter{ConfigMaps: cms}
	}
	return newElector(o, cms, w, clock.RealClock{})
}

// newElector is NewElector reading the record with get and writing it
// with w, on clk.
func newElector(o Options, get record.ConfigMapGetter, w record.Writer, clk clock.Clock) (*Elector, error) {
	if o.Pool == "" || o.Node == "" {
		return nil, errors.New("pool election: Client, Pool and Node are required")
	}
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = record.DefaultLeaseDuration
	}
	if o.RenewDeadline <= 0 {
		o.RenewDeadline = 10 * time.Second
	}
	if o.RetryPeriod <= 0 {
		o.RetryPeriod = 2 * time.Second
	}
	if o.LeaseDuration <= o.RenewDeadline {
		return nil, fmt.Errorf("pool election: lease duration %v must be greater than renew deadline %v", o.LeaseDuration, o.RenewDeadline)
	}
	if o.RenewDeadline <= time.Duration(jitterFactor*float64(o.RetryPeriod)) {
		return nil, fmt.Errorf("pool election: renew deadline %v must be greater than retry period %v * %v", o.RenewDeadline, o.RetryPeriod, jitterFactor)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Elector{o: o, lock: &recordLock{get: get, w: w, pool: o.Pool, name: record.ElectionName(o.Pool)}, clock: clk,
		changed: make(chan struct{})}, nil
}

// Run campaigns until ctx ends; it returns nil then. lead runs while this
// node leads; its context ends when the record is lost (lead must then
// stop acting as leader). On ctx's end the record is released once lead
// has returned, so that another node takes over at once. Run is called
// once.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context)) error {
	for ctx.Err() == nil {
		// Each campaign starts from nothing seen, as a new client-go
		// LeaderElector does: a holder is given a full LeaseDuration.
		e.observed, e.observedRaw, e.observedTime, e.reported = record.Election{}, nil, time.Time{}, ""
		if !e.acquire(ctx) {
			break
		}
		e.term(ctx, lead)
	}
	return nil
}

// acquire tries to take or renew the record until it succeeds (true) or
// ctx ends (false).
func (e *Elector) acquire(ctx context.Context) bool {
	for {
		ok := e.tryAcquireOrRenew(ctx)
		e.reportLeader()
		if ok {
			return true
		}
		if !ticker.Sleep(ctx, e.clock, e.o.RetryPeriod+time.Duration(rand.Float64()*jitterFactor*float64(e.o.RetryPeriod))) {
			return false
		}
	}
}

// term is this node's term as leader: lead runs while the record is
// renewed. It ends when ctx ends or a renewal has not succeeded within
// RenewDeadline; then lead's context ends and, once lead has returned,
// the record is released.
func (e *Elector) term(ctx context.Context, lead func(ctx context.Context)) {
	e.o.Logger.Info("pool leader: this node leads")
	e.setLeader(e.o.Node)
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lead(lctx)
	}()
	for e.renew(lctx) && ticker.Sleep(lctx, e.clock, e.o.RetryPeriod) {
	}
	cancel()
	if _, leading := e.Leader(); leading {
		e.o.Logger.Info("pool leader: this node no longer leads")
		e.setLeader("")
	}
	<-done
	e.release()
}

// renew tries to renew the record at once, then every RetryPeriod, until
// it succeeds (true), or RenewDeadline has passed or ctx ends (false).
func (e *Elector) renew(ctx context.Context) bool {
	deadline := e.clock.Now().Add(e.o.RenewDeadline)
	for {
		left := deadline.Sub(e.clock.Now())
		if left <= 0 || ctx.Err() != nil {
			if ctx.Err() == nil {
				e.o.Logger.Warn("pool leader: election record not renewed", "record", e.lock.String(), "within", e.o.RenewDeadline)
			}
			return false
		}
		tctx, cancel := context.WithTimeout(ctx, left)
		ok := e.tryAcquireOrRenew(tctx)
		cancel()
		e.reportLeader()
		if ok {
			return true
		}
		if !ticker.Sleep(ctx, e.clock, min(e.o.RetryPeriod, deadline.Sub(e.clock.Now()))) {
			return false
		}
	}
}

// tryAcquireOrRenew is one try to take or renew the record, client-go's
// LeaderElector.tryAcquireOrRenew.
func (e *Elector) tryAcquireOrRenew(ctx context.Context) bool {
	now := metav1.NewTime(e.clock.Now())
	rec := record.Election{HolderIdentity: e.o.Node, LeaseDurationSeconds: int(e.o.LeaseDuration / time.Second),
		AcquireTime: now, RenewTime: now}

	// The leader first writes on the ConfigMap it last wrote, saving a
	// read; a conflict sends it the long way.
	if !e.o.FollowOnly && e.isLeader() && e.leaseValid(now.Time) {
		rec.AcquireTime, rec.LeaderTransitions = e.observed.AcquireTime, e.observed.LeaderTransitions
		err := e.lock.update(ctx, rec)
		if err == nil {
			e.observe(rec)
			return true
		}
		e.o.Logger.Debug("pool election: renewal on the last record failed; reading it", "record", e.lock.String(), "err", err)
	}

	old, raw, err := e.lock.read(ctx)
	if apierrors.IsNotFound(err) {
		if e.o.FollowOnly {
			return false
		}
		if err := e.lock.create(ctx, rec); err != nil {
			e.o.Logger.Debug("pool election: record not created", "record", e.lock.String(), "err", err)
			return false
		}
		e.observe(rec)
		return true
	}
	if err != nil {
		e.o.Logger.Debug("pool election: record not read", "record", e.lock.String(), "err", err)
		return false
	}
	if !bytes.Equal(e.observedRaw, raw) {
		e.observe(old)
		e.observedRaw = raw
	}
	if e.o.FollowOnly {
		return false
	}
	if old.HolderIdentity != "" && e.leaseValid(now.Time) && !e.isLeader() {
		return false // held, and seen changing within its lease duration
	}

	if e.isLeader() {
		rec.AcquireTime, rec.LeaderTransitions = old.AcquireTime, old.LeaderTransitions
	} else {
		rec.LeaderTransitions = old.LeaderTransitions + 1
	}
	if err := e.lock.update(ctx, rec); err != nil {
		e.o.Logger.Debug("pool election: record not written", "record", e.lock.String(), "err", err)
		return false
	}
	e.observe(rec)
	return true
}

// release gives the record up, if this node holds it, with no holder and
// a lease of one second.
func (e *Elector) release() {
	ctx, cancel := context.WithTimeout(context.Background(), e.o.RenewDeadline)
	defer cancel()
	old, _, err := e.lock.read(ctx)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			e.o.Logger.Warn("pool leader: election record not released", "record", e.lock.String(), "err", err)
		}
		return
	}
	if !e.isLeader() || old.HolderIdentity != e.o.Node {
		return
	}
	now := metav1.NewTime(e.clock.Now())
	rec := record.Election{LeaseDurationSeconds: 1, AcquireTime: now, RenewTime: now, LeaderTransitions: old.LeaderTransitions}
	if err := e.lock.update(ctx, rec); err != nil {
		e.o.Logger.Warn("pool leader: election record not released", "record", e.lock.String(), "err", err)
		return
	}
	e.observe(rec)
}

// observe records rec as seen now.
func (e *Elector) observe(rec record.Election) {
	e.observed = rec
	e.observedTime = e.clock.Now()
}

func (e *Elector) isLeader() bool { return e.observed.HolderIdentity == e.o.Node }

// leaseValid reports whether the observed record's lease, counted from
// when it was seen to change, lasts past now. The lease is the record's,
// at most this node's own LeaseDuration: the holder writes
// leaseDurationSeconds, and a holder that stops renewing must lose the
// lead within the pool's configured lease whatever it wrote.
func (e *Elector) leaseValid(now time.Time) bool {
	return e.observedTime.Add(e.observed.Lease(e.o.LeaseDuration)).After(now)
}

// reportLeader passes a change of the observed holder on to Leader (this
// node's own leadership is set by term).
func (e *Elector) reportLeader() {
	holder := e.observed.HolderIdentity
	if holder == e.reported {
		return
	}
	e.reported = holder
	if holder != e.o.Node {
		e.o.Logger.Info("pool leader", "leader", holder)
		e.setLeader(holder)
	}
}

// setLeader sets the leader Leader reports: this node (it leads), another
// node, or none ("").
func (e *Elector) setLeader(leader string) {
	leading := leader == e.o.Node // Node is never "" (newElector)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.leader == leader && e.leading == leading {
		return
	}
	e.leader, e.leading = leader, leading
	close(e.changed)
	e.changed = make(chan struct{})
}

// Leader is the leader as last seen in the record ("" if none seen), and
// whether it is this node.
func (e *Elector) Leader() (string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leader, e.leading
}

// Changed is closed at the next change of Leader.
func (e *Elector) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}
