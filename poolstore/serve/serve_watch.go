package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/poolstore/replica"
)

// apiWatcher is one watch request: it follows the store's change log from
// afterRV, with Store.Changed and Store.History, and writes the changes
// in its scope as watch events. It only reads the store, so a slow
// client never holds anyone up: once the log has moved past its
// afterRV it is sent 410 Expired and relists.
type apiWatcher struct {
	h   *Handler
	req *readRequest
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte // events not written yet

	// afterRV is the resourceVersion the client is at: changes up to it
	// are sent (or not in its scope).
	afterRV uint64
	// view is, for a watch with a label selector or content fields
	// (localapi.Scope.FiltersContent), which objects the
	// client holds: key (objKey) -> the object last sent, or nil for an object
	// known not to be held. complete is true when every key the client
	// holds is in view (the watch began with the objects), false when it
	// began at a resourceVersion, before which the labels are unknown.
	view     map[string]json.RawMessage
	complete bool
}

// eventBatch is the size above which events are written without waiting
// for the end of a batch.
const eventBatch = 64 << 10

// serveWatch streams watch events for req until the client goes, its
// timeoutSeconds ends, or it must relist.
func (h *Handler) serveWatch(ctx context.Context, w http.ResponseWriter, req *readRequest) {
	var deadline <-chan time.Time
	if t := req.opts.TimeoutSeconds; t != nil && *t > 0 {
		timer := h.o.Clock.NewTimer(time.Duration(*t) * time.Second)
		defer timer.Stop()
		deadline = timer.C()
	}
	wt := &apiWatcher{h: h, req: req, w: w, rc: http.NewResponseController(w)}
	if req.scope.FiltersContent() {
		wt.view = map[string]json.RawMessage{}
	}
	if send := req.opts.SendInitialEvents; send != nil && !*send {
		if req.rv == 0 {
			// A watch from now starts at the resourceVersion current
			// before the client has its answer, so that a change made
			// once it has it is sent.
			wt.afterRV = h.s.Resources()[req.resource]
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if err := wt.rc.Flush(); err != nil { // the client has its answer before any event
		return
	}
	if err := wt.start(ctx); err != nil {
		var se *apierrors.StatusError
		if errors.As(err, &se) {
			wt.fail(se)
		}
		return
	}
	err := wt.follow(ctx, deadline)
	h.o.Logger.Debug("pool watch ended", "resource", req.resource, "rv", wt.afterRV, "err", err)
}

// start sends the initial events the request asks for and sets afterRV:
//
//   - sendInitialEvents=true: the current objects as ADDED (once the
//     replica is at least at resourceVersion), then, if bookmarks are
//     allowed, the BOOKMARK that ends them;
//   - no sendInitialEvents and resourceVersion "" or "0": the current
//     objects as ADDED;
//   - sendInitialEvents=false and resourceVersion "" or "0": nothing,
//     from the current resourceVersion;
//   - resourceVersion X: nothing, the changes after X follow.
func (wt *apiWatcher) start(ctx context.Context) error {
	opts := wt.req.opts
	rv := wt.req.rv
	send := opts.SendInitialEvents
	switch {
	case send != nil && *send:
		if err := wt.h.waitFresh(ctx, wt.req.resource, rv); err != nil {
			return err
		}
		if err := wt.sendInitial(); err != nil {
			return err
		}
		if opts.AllowWatchBookmarks {
			return wt.bookmark(localapi.InitialEventsEnd)
		}
		return nil
	case send == nil && rv == 0:
		return wt.sendInitial()
	case rv == 0:
		// from now: afterRV was taken before the answer's header
	default:
		wt.afterRV = rv
	}
	return nil
}

// sendInitial sends the objects in scope as ADDED events.
func (wt *apiWatcher) sendInitial() error {
	objs, rv, _, _ := wt.h.s.List(wt.req.resource)
	for i := range objs {
		o := &objs[i]
		if !wt.req.scope.Matches(o) {
			continue
		}
		if wt.view != nil {
			wt.view[objKey(o.Namespace, o.Name)] = o.Raw
		}
		if err := wt.add(replica.Added, o.Raw); err != nil {
			return err
		}
	}
	wt.afterRV, wt.complete = rv, true
	return wt.flush()
}

// follow sends the changes after afterRV as they come, and bookmarks if
// the client allows them, until the client goes, the deadline passes or
// the log no longer reaches afterRV.
func (wt *apiWatcher) follow(ctx context.Context, deadline <-chan time.Time) error {
	var bookmarks <-chan time.Time
	if wt.req.opts.AllowWatchBookmarks {
		t := wt.h.o.Clock.NewTicker(wt.h.o.BookmarkInterval)
		defer t.Stop()
		bookmarks = t.C()
	}
	for {
		changed := wt.h.s.Changed()
		cs, _, err := wt.h.s.History(wt.req.resource, wt.afterRV)
		if errors.Is(err, replica.ErrCompacted) {
			wt.fail(apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d", wt.afterRV)))
			return err
		}
		if len(cs) == 0 && !wt.h.Serves(wt.req.resource) {
			wt.fail(apierrors.NewResourceExpired(fmt.Sprintf("the node pool's replica no longer holds %s", wt.req.gvr.GroupResource())))
			return errors.New("resource no longer in the replica")
		}
		if err := wt.sendChanges(cs); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return nil
		case <-changed:
		case <-bookmarks:
			if err := wt.bookmark(localapi.ProgressBookmark); err != nil {
				return err
			}
		}
	}
}

// sendChanges sends the events of cs for the client and raises afterRV.
func (wt *apiWatcher) sendChanges(cs []replica.Change) error {
	sent := 0
	for _, c := range cs {
		wt.afterRV = max(wt.afterRV, c.RV)
		if c.Type == replica.Bookmark {
			continue
		}
		typ, obj := wt.event(c)
		if typ == "" {
			continue
		}
		if err := wt.add(typ, obj); err != nil {
			return err
		}
		sent++
	}
	if sent == 0 {
		return nil
	}
	return wt.flush()
}

// event returns the event c is for the client ("" for none). With a
// label selector an object can enter or leave the scope: it is sent as
// ADDED when it starts to match and as DELETED (its last matching state
// at the change's resourceVersion) when it stops, as kube-apiserver does.
func (wt *apiWatcher) event(c replica.Change) (typ string, obj json.RawMessage) {
	if !wt.req.scope.MatchesKey(c.Namespace, c.Name) {
		return "", nil
	}
	if wt.view == nil {
		return c.Type, c.Object
	}
	k := objKey(c.Namespace, c.Name)
	prev, known := wt.view[k]
	if !known && (wt.complete || c.Type == replica.Added) {
		known = true // not held
	}
	held := prev != nil
	matches := wt.matchesContent(c.Object)
	switch {
	case c.Type == replica.Deleted:
		wt.forget(k)
		if held || (!known && matches) {
			return replica.Deleted, c.Object
		}
	case matches:
		wt.view[k] = c.Object
		switch {
		case held:
			return replica.Modified, c.Object
		case known:
			return replica.Added, c.Object
		}
		return c.Type, c.Object
	case held:
		wt.forget(k)
		last, err := localapi.WithResourceVersion(prev, c.RV, "", "")
		if err != nil {
			last = c.Object
		}
		return replica.Deleted, last
	case !known:
		// It may have matched before the watch began: the client drops
		// it if it holds it, and ignores the event if not.
		wt.forget(k)
		return replica.Deleted, c.Object
	}
	return "", nil
}

// forget records that the client no longer holds k.
func (wt *apiWatcher) forget(k string) {
	if wt.complete {
		delete(wt.view, k)
	} else {
		wt.view[k] = nil
	}
}

func (wt *apiWatcher) matchesContent(raw json.RawMessage) bool {
	o, err := localapi.DecodeObject(raw, "", "")
	return err == nil && wt.req.scope.MatchesContent(o.Labels, o.Field)
}

// bookmark sends a BOOKMARK of kind bk at afterRV.
func (wt *apiWatcher) bookmark(bk localapi.BookmarkKind) error {
	if wt.afterRV == 0 {
		return nil
	}
	wt.buf = localapi.AppendBookmark(wt.buf, wt.h.kind(wt.req.resource), wt.req.gvr.GroupVersion().String(), wt.afterRV, bk)
	return wt.flush()
}

// fail sends an ERROR event: the watch ends after it.
func (wt *apiWatcher) fail(err *apierrors.StatusError) {
	wt.buf = localapi.AppendErrorEvent(wt.buf, err)
	if wt.batched() == nil {
		wt.flush()
	}
}

// add appends an event to the batch, writing the batch once it is large.
func (wt *apiWatcher) add(typ string, obj json.RawMessage) error {
	wt.buf = localapi.AppendEvent(wt.buf, typ, obj)
	return wt.batched()
}

// batched writes the batch once it is large.
func (wt *apiWatcher) batched() error {
	if len(wt.buf) < eventBatch {
		return nil
	}
	return wt.write()
}

func (wt *apiWatcher) write() error {
	if len(wt.buf) == 0 {
		return nil
	}
	_, err := wt.w.Write(wt.buf)
	wt.buf = wt.buf[:0]
	if err != nil {
		return fmt.Errorf("write watch events: %w", err)
	}
	return nil
}

// flush writes the batch and sends it to the client now.
func (wt *apiWatcher) flush() error {
	if err := wt.write(); err != nil {
		return err
	}
	if err := wt.rc.Flush(); err != nil {
		return fmt.Errorf("flush watch events: %w", err)
	}
	return nil
}

// objKey is an object's key in a watch's view: namespace/name.
func objKey(namespace, name string) string { return namespace + "/" + name }
