package apiproxy

import (
	"encoding/json"
	"fmt"
	"net/http"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

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
// has it, computed as kubelet computes its own status patches (a two-way
// strategic merge patch, or a JSON merge patch). Upstream it has the net
// effect of the patches it replaces on every field they wrote.
//
// JSON patches (a list of operations) and updates are never coalesced;
// a later update already makes the writes before it obsolete (replay).

// coalescible reports whether a patch of this content type keeps a Base
// and can take another's place.
func coalescible(contentType string) bool {
	switch mediaType(contentType) {
	case "application/strategic-merge-patch+json", "application/merge-patch+json":
		return true
	}
	return false
}

// patchBetween returns the patch, of contentType, that makes final out of
// base, without their resourceVersions (which the cache bumps on every
// local write, and which in a patch would be a precondition upstream).
func patchBetween(contentType string, base, final []byte, resource string) ([]byte, error) {
	var err error
	if base, err = withoutResourceVersion(base); err != nil {
		return nil, err
	}
	if final, err = withoutResourceVersion(final); err != nil {
		return nil, err
	}
	switch mediaType(contentType) {
	case "application/strategic-merge-patch+json":
		t, ok := patchTypes[resource]
		if !ok {
			return nil, fmt.Errorf("no strategic merge patch of %s offline", resource)
		}
		return strategicpatch.CreateTwoWayMergePatch(base, final, t)
	case "application/merge-patch+json":
		return jsonpatch.CreateMergePatch(base, final)
	}
	return nil, fmt.Errorf("patches of type %q are not coalesced", contentType)
}

func withoutResourceVersion(raw []byte) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if meta, _ := m["metadata"].(map[string]any); meta != nil {
		delete(meta, "resourceVersion")
	}
	return json.Marshal(m)
}

// enqueue queues w, whose result is the object as the edge now has it,
// in place of the object's latest queued write when both are patches
// that coalesce (see above); otherwise at the end of the queue.
func (p *Proxy) enqueue(w *cache.QueuedWrite, result []byte) error {
	p.queueMu.Lock()
	defer p.queueMu.Unlock()
	if prev := p.coalesceInto(*w); prev != 0 {
		old, err := p.store.QueuedWrite(prev)
		if err == nil && old != nil && len(old.Base) > 0 {
			body, err := patchBetween(w.ContentType, old.Base, result, w.Resource)
			if err == nil {
				nw := *w
				nw.Body, nw.Base = body, old.Base
				replaced, err := p.store.ReplaceQueued(prev, &nw)
				if err != nil {
					return err
				}
				*w = nw
				p.noteReplaced(prev, replaced, nw)
				return nil
			}
			p.log.Debug("status patch not coalesced", "seq", prev, "err", err)
		}
	}
	if err := p.store.Enqueue(w); err != nil {
		return err
	}
	p.noteQueued(*w)
	return nil
}

// coalesceInto returns the seq of the queued write that w may take the
// place of: the latest of its object, if that is a patch of the same type
// by the same component with a Base. Zero if none.
func (p *Proxy) coalesceInto(w cache.QueuedWrite) uint64 {
	if w.Method != http.MethodPatch || len(w.Base) == 0 {
		return 0
	}
	p.qmu.Lock()
	defer p.qmu.Unlock()
	o := p.pending[objectKey(w)]
	if o == nil || o.last == 0 || o.last == p.inflight || !o.lastCoalescible ||
		o.lastComponent != w.Component || o.lastContentType != w.ContentType {
		return 0
	}
	return o.last
}

// startReplay marks the queued write seq as being replayed, so that no
// patch takes its place meanwhile; false if one already has (the write is
// no longer queued). doneReplay ends it.
func (p *Proxy) startReplay(seq uint64) bool {
	p.queueMu.Lock()
	defer p.queueMu.Unlock()
	p.qmu.Lock()
	defer p.qmu.Unlock()
	if _, gone := p.replaced[seq]; gone {
		return false
	}
	p.inflight = seq
	return true
}

func (p *Proxy) doneReplay() {
	p.qmu.Lock()
	defer p.qmu.Unlock()
	p.inflight = 0
}

// noteReplaced counts w, queued in place of old (replaced: old was still
// queued; otherwise it was replayed meanwhile and w is one more write).
func (p *Proxy) noteReplaced(old uint64, replaced bool, w cache.QueuedWrite) {
	if !replaced {
		p.noteQueued(w)
		return
	}
	p.m.replayed.WithLabelValues(replayCoalesced).Inc()
	p.qmu.Lock()
	defer p.qmu.Unlock()
	p.replaced[old] = w.Seq
	if o := p.pending[objectKey(w)]; o != nil {
		o.noteLast(w)
	}
}

// noteLast records w as the object's latest queued write.
func (o *pendingObject) noteLast(w cache.QueuedWrite) {
	o.last = w.Seq
	o.lastCoalescible = w.Method == http.MethodPatch && len(w.Base) > 0 && coalescible(w.ContentType)
	o.lastComponent, o.lastContentType = w.Component, w.ContentType
}

// takeReplaced hands the backoffs of replaced writes on to the writes
// that took their place, and forgets the replaced ones (Run's goroutine,
// between replays).
func (p *Proxy) takeReplaced() {
	p.qmu.Lock()
	defer p.qmu.Unlock()
	for old, seq := range p.replaced {
		// Follow a chain of replacements to the write queued now.
		for n := 0; n < len(p.replaced); n++ {
			next, ok := p.replaced[seq]
			if !ok {
				break
			}
			seq = next
		}
		if r := p.retries[old]; r != nil {
			if cur := p.retries[seq]; cur == nil || cur.next.Before(r.next) {
				p.retries[seq] = r
			}
		}
	}
	for old := range p.replaced {
		delete(p.retries, old)
		delete(p.replaced, old)
	}
}
