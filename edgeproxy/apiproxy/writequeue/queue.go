// Package writequeue is the queue of status writes tether-edge's
// kube-apiserver proxy (package apiproxy) accepted while the cloud was
// unreachable: kept durably in the cache file (package cache: bbolt,
// fsynced before the write is answered), coalesced (a later patch of an
// object takes the place of its queued one), and replayed in order, as
// the component that made them, once the cloud is back, each write
// backing off on its own when the cloud refuses it for now. Each write
// leaves the queue in the transaction that counts why in the queue's
// ledger (applied, coalesced, obsolete, rejected; resent when a send may
// have been applied twice).
//
// README.md describes the data flow and the invariants.
package writequeue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/edgeproxy/apiproxy/internal/statuspatch"
	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/statusapi"
)

// Upstream is what the queue needs of the cloud apiservers (package
// upstream).
type Upstream interface {
	// Server is the apiserver to use now; ok is false when none is
	// healthy.
	Server() (u *url.URL, ok bool)
	Healthy() bool
	// Changed is closed at the next change of Healthy.
	Changed() <-chan struct{}
	// Kick asks for a health check now: a request just failed.
	Kick()
}

// Options configure New.
type Options struct {
	// Store keeps the queue and its ledger (and the cache, which the
	// apiserver's answers to replayed writes update).
	Store    *cache.Store
	Upstream Upstream
	// Transport carries the replay's requests to the cloud, as the node.
	Transport http.RoundTripper
	// NodeName is this node: its own Node's status patches are rebased
	// rather than dropped when another manager wrote the status since
	// (rebase.go). Empty disables that.
	NodeName   string
	Clock      clock.WithTicker
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Object names the object a queued write writes.
type Object struct {
	Group, Resource, Namespace, Name string
}

// ObjectOf is the object q writes.
func ObjectOf(q cache.QueuedWrite) Object {
	return Object{Group: q.Group, Resource: q.Resource, Namespace: q.Namespace, Name: q.Name}
}

// Queue is the queue of status writes made offline. Enqueue, Queued, Len,
// Ledger and Kick may be called from any goroutine; Run replays.
type Queue struct {
	store *cache.Store
	up    Upstream
	rt    http.RoundTripper
	node  string
	clock clock.WithTicker
	log   *slog.Logger
	m     *metrics

	replayCh chan struct{}

	// queueMu makes a patch taking a queued write's place (coalesce.go)
	// one step, against the replay starting to send that write.
	queueMu sync.Mutex

	qmu      sync.Mutex
	qlen     int
	pending  map[Object]*pendingObject
	replaced map[uint64]uint64 // queued writes coalesced since the last replay: the seq of the one in their place
	inflight uint64            // the queued write being replayed

	// retries are the backoffs of queued writes by seq, and of the
	// replay under 0 (Run's goroutine only).
	retries map[uint64]*retryState
}

// pendingObject is what the queue holds of one object.
type pendingObject struct {
	writes  int
	lastPut uint64 // seq of the latest update (PUT), 0 if none

	// The latest queued write (0 once it is replayed), and whether a
	// patch may take its place (coalesce.go).
	last            uint64
	lastCoalescible bool
	lastComponent   string
	lastContentType string
}

// New reads the queue the store holds; Run replays it.
func New(o Options) (*Queue, error) {
	if o.Store == nil || o.Upstream == nil || o.Transport == nil {
		return nil, errors.New("writequeue: Store, Upstream and Transport are required")
	}
	q := &Queue{store: o.Store, up: o.Upstream, rt: o.Transport, node: o.NodeName, clock: o.Clock, log: o.Logger,
		replayCh: make(chan struct{}, 1), pending: map[Object]*pendingObject{}, replaced: map[uint64]uint64{},
		retries: map[uint64]*retryState{}}
	if q.clock == nil {
		q.clock = clock.RealClock{}
	}
	if q.log == nil {
		q.log = slog.New(slog.DiscardHandler)
	}
	for w, err := range o.Store.QueuedWrites(0) {
		if err != nil {
			return nil, fmt.Errorf("writequeue: %w", err)
		}
		q.noteQueued(w)
	}
	var err error
	if q.m, err = newMetrics(o.Registerer, func() float64 { return float64(q.Len()) }); err != nil {
		return nil, err
	}
	return q, nil
}

// Enqueue keeps w durably (answered only once on disk) and counts it in
// the ledger. base is the object as cached before w (nil if not cached),
// result the object as the edge has it with w applied. A strategic merge
// or JSON merge patch keeps base, and takes the place of the object's
// latest queued write when that is a patch of the same type by the same
// component that the replay is not sending (coalesce.go); anything else
// goes at the end of the queue. w's Seq is set.
func (q *Queue) Enqueue(w *cache.QueuedWrite, base, result []byte) error {
	if w.Method == http.MethodPatch && statuspatch.Diffable(w.ContentType) {
		w.Base = base
	}
	q.queueMu.Lock()
	defer q.queueMu.Unlock()
	if prev := q.coalesceInto(*w); prev != 0 {
		old, err := q.store.QueuedWrite(prev)
		if err == nil && old != nil && len(old.Base) > 0 {
			body, err := statuspatch.Between(w.ContentType, old.Base, result, w.Resource)
			if err == nil {
				nw := *w
				nw.Body, nw.Base = body, old.Base
				replaced, err := q.store.ReplaceQueued(prev, &nw)
				if err != nil {
					return err
				}
				*w = nw
				q.noteReplaced(prev, replaced, nw)
				return nil
			}
			q.log.Debug("status patch not coalesced", "seq", prev, "err", err)
		}
	}
	if err := q.store.Enqueue(w); err != nil {
		return err
	}
	q.noteQueued(*w)
	return nil
}

// Len is the number of queued writes.
func (q *Queue) Len() int {
	q.qmu.Lock()
	defer q.qmu.Unlock()
	return q.qlen
}

// Queued reports whether writes of the object are queued: a write of it
// made now goes behind them, so that the object's writes reach the cloud
// in order.
func (q *Queue) Queued(o Object) bool {
	q.qmu.Lock()
	defer q.qmu.Unlock()
	return q.pending[o] != nil
}

// Kick has Run look at the queue now.
func (q *Queue) Kick() {
	select {
	case q.replayCh <- struct{}{}:
	default:
	}
}

// Ledger is the queue's ledger for /status, nil if it does not read.
func (q *Queue) Ledger() *statusapi.QueueLedger {
	l, err := q.store.Ledger()
	if err != nil {
		q.log.Warn("cannot read the queue's ledger", "err", err)
		return nil
	}
	return &statusapi.QueueLedger{Enqueued: l.Enqueued, Coalesced: l.Coalesced, Applied: l.Applied, Obsolete: l.Obsolete,
		Rejected: l.Rejected, Queued: l.Queued, Resent: l.Resent, Unconfirmed: l.Unconfirmed, Balanced: l.Balanced()}
}

// Dequeue removes a write from the queue, counted in the ledger as
// outcome says.
func (q *Queue) Dequeue(w cache.QueuedWrite, outcome cache.Outcome) error {
	if err := q.store.Dequeue(w.Seq, outcome); err != nil {
		return err
	}
	delete(q.retries, w.Seq)
	q.qmu.Lock()
	defer q.qmu.Unlock()
	q.qlen--
	key := ObjectOf(w)
	if o := q.pending[key]; o != nil {
		if o.writes--; o.writes <= 0 {
			delete(q.pending, key)
		} else if o.last == w.Seq {
			o.last = 0
		}
	}
	return nil
}

// lastPut is the seq of the latest queued update (PUT) of the object.
func (q *Queue) lastPut(key Object) uint64 {
	q.qmu.Lock()
	defer q.qmu.Unlock()
	if o := q.pending[key]; o != nil {
		return o.lastPut
	}
	return 0
}

// noteQueued counts a write that is in the queue.
func (q *Queue) noteQueued(w cache.QueuedWrite) {
	q.qmu.Lock()
	defer q.qmu.Unlock()
	q.qlen++
	key := ObjectOf(w)
	o := q.pending[key]
	if o == nil {
		o = &pendingObject{}
		q.pending[key] = o
	}
	o.writes++
	if w.Method == http.MethodPut {
		o.lastPut = max(o.lastPut, w.Seq)
	}
	if w.Seq > o.last {
		o.noteLast(w)
	}
}

// Run replays queued status writes whenever the cloud is healthy, until
// ctx ends (replay.go). A write the cloud answers 5xx or 429 backs off on
// its own (jittered, bounded by replayBackoffMax) while the writes of
// other objects go on; later writes of the same object wait behind it,
// unless a later update (PUT) replaces it.
func (q *Queue) Run(ctx context.Context) error {
	for {
		changed := q.up.Changed()
		var wake clock.Timer
		var wakeC <-chan time.Time
		if q.up.Healthy() && q.Len() > 0 {
			if next := q.replay(ctx); !next.IsZero() {
				wake = q.clock.NewTimer(next.Sub(q.clock.Now()))
				wakeC = wake.C()
			}
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-q.replayCh:
		case <-wakeC:
		}
		if wake != nil {
			wake.Stop()
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}
