package poolstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/replica"
)

// Why a stream ends, besides the follower leaving or a failed write. The
// follower reconnects; with another epoch or too far behind it gets a
// snapshot.
var (
	errNoLongerLeader = errors.New("this node no longer leads")
	errEpochChanged   = errors.New("the leader started a new term")
	errBehind         = errors.New("follower fell behind the change log")
)

// serveReplicate streams this leader's store to a follower: the changes
// after ?rev=N if ?epoch=E is the store's and its log still holds them,
// else a snapshot; then every change as it comes, and sync frames.
func (s *Server) serveReplicate(w http.ResponseWriter, r *http.Request) {
	if !s.leading() {
		s.notLeader(w)
		return
	}
	q := r.URL.Query()
	var rev uint64
	if v := q.Get("rev"); v != "" {
		var err error
		if rev, err = strconv.ParseUint(v, 10, 64); err != nil {
			writeError(w, http.StatusBadRequest, reasonBadRequest, "rev: "+err.Error(), "")
			return
		}
	}
	peer := peerOf(r)
	log := s.log.With("node", peer)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	s.m.streams.Inc()
	defer s.m.streams.Dec()

	st := &stream{s: s, w: w, rc: http.NewResponseController(w)}
	err := st.run(r.Context(), q.Get("epoch"), rev)
	reason := endReason(r.Context(), err)
	s.m.ended.WithLabelValues(reason).Inc()
	switch reason {
	case endedFollowerGone:
		log.Debug("pool replication stream ended by the follower", "sent_frames", st.frames)
	case endedBehind:
		log.Warn("pool follower too slow: stream ended, it will resync from a snapshot", "err", err)
	default:
		log.Info("pool replication stream ended", "reason", reason, "err", err, "sent_frames", st.frames)
	}
}

// Why a stream ended, the "reason" label of streams_ended_total.
const (
	endedFollowerGone = "follower_gone"
	endedBehind       = "behind"
	endedNewTerm      = "new_term"
	endedNotLeader    = "not_leader"
	endedWriteFailed  = "write_failed"
)

func endReason(ctx context.Context, err error) string {
	switch {
	case ctx.Err() != nil:
		return endedFollowerGone
	case errors.Is(err, errBehind):
		return endedBehind
	case errors.Is(err, errEpochChanged):
		return endedNewTerm
	case errors.Is(err, errNoLongerLeader):
		return endedNotLeader
	default:
		return endedWriteFailed
	}
}

// stream is one follower's replication stream.
type stream struct {
	s      *Server
	w      http.ResponseWriter
	rc     *http.ResponseController
	frames int
}

// run writes the stream until the follower leaves, this node stops
// leading, its term changes or a write fails. It holds at most one
// frame's bytes and one Since's worth of changes: a follower that cannot
// keep up with the log ends up behind it, and resyncs.
func (st *stream) run(ctx context.Context, epoch string, rev uint64) error {
	store := st.s.o.Store
	chains := store.Chains()
	if err := st.write(frame{Type: frameTrust, Epoch: store.Epoch(), Rev: store.Rev(), Chains: chains}); err != nil {
		return err
	}
	pos, epoch, err := st.start(epoch, rev)
	if err != nil {
		return err
	}
	ticker := st.s.o.Clock.NewTicker(st.s.o.SyncEvery)
	defer ticker.Stop()
	var sentSync time.Time
	syncDue := true
	for {
		changed := store.Changed()
		if !st.s.leading() {
			return errNoLongerLeader
		}
		cs, err := store.Since(pos)
		// Epochs are never reused: the same one before and after Since
		// means cs belong to it.
		if store.Epoch() != epoch {
			return errEpochChanged
		}
		if errors.Is(err, replica.ErrCompacted) {
			return fmt.Errorf("%w: at revision %d", errBehind, pos)
		}
		if err != nil {
			return err
		}
		if now := store.Chains(); !sameChains(now, chains) {
			// Before the changes: they may be signed by the new key.
			if err := st.write(frame{Type: frameTrust, Epoch: epoch, Rev: pos, Chains: now}); err != nil {
				return err
			}
			chains = now
		}
		if pos, err = st.changes(epoch, pos, cs); err != nil {
			return err
		}
		if at := store.SyncedAt(); syncDue || !at.Equal(sentSync) {
			// The mark (about 700 bytes) once; then keepalives.
			var mark json.RawMessage
			if !at.Equal(sentSync) || sentSync.IsZero() {
				mark = store.Mark()
			}
			if err := st.sync(epoch, mark); err != nil {
				return err
			}
			sentSync, syncDue = at, false
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-ticker.C():
			syncDue = true
		}
	}
}

// start resumes the follower at (epoch, rev) when it can, else sends a
// snapshot; it returns the revision the follower has then, and the epoch.
func (st *stream) start(epoch string, rev uint64) (uint64, string, error) {
	store := st.s.o.Store
	if epoch != "" && epoch == store.Epoch() && rev <= store.Rev() {
		cs, err := store.Since(rev)
		if err == nil && store.Epoch() == epoch {
			pos, err := st.changes(epoch, rev, cs)
			return pos, epoch, err
		}
	}
	snap := store.Snapshot()
	err := st.write(frame{Type: frameSnapshot, Epoch: snap.Epoch, Rev: snap.Rev,
		Resources: snap.Resources, Count: len(snap.Objects), Attests: snap.Attests, Mark: snap.Mark, Chains: snap.Chains})
	for _, b := range batches(snap.Objects) {
		if err != nil {
			break
		}
		err = st.write(frame{Type: frameObjects, Epoch: snap.Epoch, Rev: snap.Rev, Items: b})
	}
	return snap.Rev, snap.Epoch, err
}

// changes sends cs, the changes after pos, and returns the revision
// reached.
func (st *stream) changes(epoch string, pos uint64, cs []replica.Change) (uint64, error) {
	if len(cs) == 0 {
		return pos, nil
	}
	rev := st.s.o.Store.Rev()
	for _, b := range batches(cs) {
		line, err := st.s.encoded.changesFrame(epoch, rev, b)
		if err != nil {
			return pos, err
		}
		if err := st.send(frameChanges, line); err != nil {
			return pos, err
		}
	}
	return cs[len(cs)-1].Rev, nil
}

// encodedChanges keeps the JSON of the latest changes of the log, so that
// a change is encoded once for all the followers' streams rather than
// once per stream (at 100 followers, encoding was a third of the
// leader's CPU). Slots are by revision; a change of another epoch or
// revision in its slot is encoded again. Bounded: encodedSlots changes
// of at most encodedMaxBytes each.
type encodedChanges struct {
	mu    sync.Mutex
	slots [encodedSlots]encodedChange
}

type encodedChange struct {
	epoch string
	rev   uint64
	json  []byte // nil: empty slot
}

const (
	encodedSlots    = 512
	encodedMaxBytes = 32 << 10
)

// change returns c's JSON (json.Marshal's), from the cache when it holds
// it. The bytes returned must not be modified.
func (e *encodedChanges) change(epoch string, c replica.Change) ([]byte, error) {
	slot := &e.slots[c.Rev%encodedSlots]
	e.mu.Lock()
	if slot.json != nil && slot.rev == c.Rev && slot.epoch == epoch {
		b := slot.json
		e.mu.Unlock()
		return b, nil
	}
	e.mu.Unlock()
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode change %d: %w", c.Rev, err)
	}
	if len(b) <= encodedMaxBytes {
		e.mu.Lock()
		*slot = encodedChange{epoch: epoch, rev: c.Rev, json: b}
		e.mu.Unlock()
	}
	return b, nil
}

// changesFrame is the line of a changes frame of items, byte for byte
// what json.Marshal makes of frame{Type: frameChanges, Epoch: epoch,
// Rev: rev, Items: items} and a newline, with the items' JSON from the
// cache.
func (e *encodedChanges) changesFrame(epoch string, rev uint64, items []replica.Change) ([]byte, error) {
	head, err := json.Marshal(frame{Type: frameChanges, Epoch: epoch, Rev: rev})
	if err != nil {
		return nil, fmt.Errorf("encode changes frame: %w", err)
	}
	// The fields after rev are all empty but items: splice them in
	// before the closing brace.
	line := append(head[:len(head)-1:len(head)-1], `,"items":[`...)
	for i, c := range items {
		b, err := e.change(epoch, c)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			line = append(line, ',')
		}
		line = append(line, b...)
	}
	return append(line, "]}\n"...), nil
}

// sync sends a sync frame with mark, the leader's last signed mark when
// it is new to the follower (nil: a keepalive).
func (st *stream) sync(epoch string, mark json.RawMessage) error {
	return st.write(frame{Type: frameSync, Epoch: epoch, Rev: st.s.o.Store.Rev(), Mark: mark})
}

// sameChains reports whether a and b hold the same chains (the store
// replaces its slice when they change).
func sameChains(a, b [][][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) || (len(a[i]) > 0 && feed.KeyID(a[i][0]) != feed.KeyID(b[i][0])) {
			return false
		}
	}
	return true
}

// write sends one frame and flushes it.
func (st *stream) write(f frame) error {
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode %s frame: %w", f.Type, err)
	}
	return st.send(f.Type, append(b, '\n'))
}

// send writes one encoded frame of type typ, a line, and flushes it.
func (st *stream) send(typ string, b []byte) error {
	// Best effort: a ResponseWriter without deadlines still ends with
	// the connection's pings.
	_ = st.rc.SetWriteDeadline(time.Now().Add(st.s.o.WriteTimeout))
	if _, err := st.w.Write(b); err != nil {
		return fmt.Errorf("write %s frame: %w", typ, err)
	}
	if err := st.rc.Flush(); err != nil {
		return fmt.Errorf("flush %s frame: %w", typ, err)
	}
	st.frames++
	st.s.m.frames.WithLabelValues(typ).Inc()
	st.s.m.bytes.Add(float64(len(b)))
	return nil
}
