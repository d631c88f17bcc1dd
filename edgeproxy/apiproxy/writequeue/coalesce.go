package writequeue

import (
	"net/http"

	"github.com/tether-edge/tether/edgeproxy/apiproxy/internal/statuspatch"
	"github.com/tether-edge/tether/edgeproxy/cache"
)

// Coalescing of queued patches.
//
// A kubelet that is offline for hours patches its Node's and its pods'
// status every few seconds; queued one by one, those patches fill the
// queue and make the replay long once the cloud is back. A patch queued
// while the object's latest queued write is a patch of the same kind by
// the same component takes that write's place instead: the queued
// write's Base is the object as cached before the first of them, and the
// new body is the difference from Base to the object as the edge now
// has it (statuspatch.Between). Upstream it has the net effect of the
// patches it replaces on every field they wrote.
//
// JSON patches (a list of operations) and updates are never coalesced;
// a later update already makes the writes before it obsolete (replay).

// coalesceInto returns the seq of the queued write that w may take the
// place of: the latest of its object, if that is a patch of the same type
// by the same component with a Base. Zero if none.
func (q *Queue) coalesceInto(w cache.QueuedWrite) uint64 {
	if w.Method != http.MethodPatch || len(w.Base) == 0 {
		return 0
	}
	q.qmu.Lock()
	defer q.qmu.Unlock()
	o := q.pending[ObjectOf(w)]
	if o == nil || o.last == 0 || o.last == q.inflight || !o.lastCoalescible ||
		o.lastComponent != w.Component || o.lastContentType != w.ContentType {
		return 0
	}
	return o.last
}

// startReplay marks the queued write seq as being replayed, so that no
// patch takes its place meanwhile; false if one already has (the write is
// no longer queued). doneReplay ends it.
func (q *Queue) startReplay(seq uint64) bool {
	q.queueMu.Lock()
	defer q.queueMu.Unlock()
	q.qmu.Lock()
	defer q.qmu.Unlock()
	if _, gone := q.replaced[seq]; gone {
		return false
	}
	q.inflight = seq
	return true
}

func (q *Queue) doneReplay() {
	q.qmu.Lock()
	defer q.qmu.Unlock()
	q.inflight = 0
}

// noteReplaced counts w, queued in place of old (replaced: old was still
// queued; otherwise it was replayed meanwhile and w is one more write).
func (q *Queue) noteReplaced(old uint64, replaced bool, w cache.QueuedWrite) {
	if !replaced {
		q.noteQueued(w)
		return
	}
	q.m.replayed.WithLabelValues(replayCoalesced).Inc()
	q.qmu.Lock()
	defer q.qmu.Unlock()
	q.replaced[old] = w.Seq
	if o := q.pending[ObjectOf(w)]; o != nil {
		o.noteLast(w)
	}
}

// noteLast records w as the object's latest queued write.
func (o *pendingObject) noteLast(w cache.QueuedWrite) {
	o.last = w.Seq
	o.lastCoalescible = w.Method == http.MethodPatch && len(w.Base) > 0 && statuspatch.Diffable(w.ContentType)
	o.lastComponent, o.lastContentType = w.Component, w.ContentType
}

// takeReplaced hands the backoffs of replaced writes on to the writes
// that took their place, and forgets the replaced ones (Run's goroutine,
// between replays).
func (q *Queue) takeReplaced() {
	q.qmu.Lock()
	defer q.qmu.Unlock()
	for old, seq := range q.replaced {
		// Follow a chain of replacements to the write queued now.
		for n := 0; n < len(q.replaced); n++ {
			next, ok := q.replaced[seq]
			if !ok {
				break
			}
			seq = next
		}
		if r := q.retries[old]; r != nil {
			if cur := q.retries[seq]; cur == nil || cur.next.Before(r.next) {
				q.retries[seq] = r
			}
		}
	}
	for old := range q.replaced {
		delete(q.retries, old)
		delete(q.replaced, old)
	}
}
