package apiproxy

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edgeproxy/apiproxy/internal/statuspatch"
	"github.com/tether-edge/tether/edgeproxy/apiproxy/writequeue"
	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/localapi"
)

// serveRead answers a get or list from the cache. why is why the cloud
// does not answer it (unreachableMessage, or noAnswer); a refusal says it.
func (p *Proxy) serveRead(w http.ResponseWriter, r *http.Request, req request, why string) string {
	if req.Verb == localapi.VerbGet {
		o, err := p.store.Get(req.comp, req.GVR, req.Namespace, req.Name)
		if err != nil {
			writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, nil, "tether-edge: read cache: %v", err)
			return servedError
		}
		if o == nil {
			p.m.misses.WithLabelValues(req.comp).Inc()
			if _, found := p.store.Info(req.comp, req.GVR); !found {
				refuse(w, why, "%s were never cached for %s", req.GVR.Resource, req.comp)
				return servedRefused
			}
			if p.ownCSINode(req) {
				refuse(w, why, "this node's CSINode was never cached for %s", req.comp)
				return servedRefused
			}
			writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound,
				&metav1.StatusDetails{Name: req.Name, Group: req.GVR.Group, Kind: req.GVR.Resource},
				"%s %q not found", req.GVR.Resource, req.Name)
			return servedCache
		}
		p.m.hits.WithLabelValues(req.comp).Inc()
		localapi.WriteJSON(w, http.StatusOK, o.Raw)
		return servedCache
	}

	if req.scopeErr != nil {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, nil, "%v", req.scopeErr)
		return servedError
	}
	// The items are copied out of the store inside the read transaction
	// (a memory copy, no I/O).
	var items [][]byte
	info, found, err := p.store.Scan(req.comp, req.GVR, req.scope, func(o *localapi.Object) {
		items = append(items, bytes.Clone(o.Raw))
	})
	if err != nil {
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, nil, "tether-edge: %v", err)
		return servedError
	}
	if !found {
		p.m.misses.WithLabelValues(req.comp).Inc()
		refuse(w, why, "%s were never cached for %s", req.GVR.Resource, req.comp)
		return servedRefused
	}
	p.m.hits.WithLabelValues(req.comp).Inc()
	localapi.WriteList(w, info.Kind+"List", info.APIVersion, info.MaxRV, items)
	return servedCache
}

// cloudState is what the proxy knew of the cloud when it began to serve
// a watch itself; it decides what ends the hold (see hold).
type cloudState uint8

const (
	// cloudOffline: the health checks failed; the hold ends when they
	// pass again.
	cloudOffline cloudState = iota
	// cloudSilent: the health checks still pass, but the cloud did not
	// answer the watch or its watch broke; the hold also ends when a
	// recheck finds the cloud healthy.
	cloudSilent
)

// serveWatch serves a watch offline: with sendInitialEvents, the cached
// objects as ADDED events and the bookmark that ends them; then nothing,
// until hold lets it end. cloud is why the cloud is not asked (the
// health checks failed, or it did not answer); why says so to a client
// that is refused, as for serveRead.
func (p *Proxy) serveWatch(w http.ResponseWriter, r *http.Request, req request, start time.Time, cloud cloudState, why string) string {
	if req.scopeErr != nil {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, nil, "%v", req.scopeErr)
		return servedError
	}
	var events []byte
	if localapi.IsTrue(r.URL.Query().Get("sendInitialEvents")) {
		info, found, err := p.store.Scan(req.comp, req.GVR, req.scope, func(o *localapi.Object) {
			events = localapi.AppendEvent(events, localapi.Added, o.Raw)
		})
		if err != nil || !found {
			p.m.misses.WithLabelValues(req.comp).Inc()
			refuse(w, why, "%s were never cached for %s", req.GVR.Resource, req.comp)
			return servedRefused
		}
		events = localapi.AppendBookmark(events, info.Kind, info.APIVersion, info.MaxRV, localapi.InitialEventsEnd)
	}
	p.m.hits.WithLabelValues(req.comp).Inc()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(events)
	http.NewResponseController(w).Flush()
	p.hold(r, start, cloud)
	return servedCache
}

// hold keeps a watch open without events until the cloud is back (the
// health checks turn healthy after having failed, or, for a watch whose
// upstream broke while the checks still passed, a recheck finds the
// cloud healthy), its timeoutSeconds ends, or the client goes. It waits
// on channels and timers only: no polling loop. The end is then jittered
// so that clients do not all come back at once.
func (p *Proxy) hold(r *http.Request, start time.Time, cloud cloudState) {
	held := p.m.watchesOpen.WithLabelValues("held")
	held.Inc()
	defer held.Dec()
	ctx := r.Context()
	var deadline <-chan time.Time
	if timeout := watchTimeout(r); timeout > 0 {
		t := p.clock.NewTimer(timeout - p.clock.Since(start))
		defer t.Stop()
		deadline = t.C()
	}
	recheck := p.clock.NewTicker(p.recheck)
	defer recheck.Stop()
	sawUnhealthy := cloud == cloudOffline
wait:
	for {
		changed := p.up.Changed()
		if !p.up.Healthy() {
			sawUnhealthy = true
		} else if sawUnhealthy {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			return
		case <-changed:
		case <-recheck.C():
			if p.up.Healthy() {
				break wait
			}
		}
	}
	j := p.clock.NewTimer(rand.N(p.jitter))
	defer j.Stop()
	select {
	case <-ctx.Done():
	case <-deadline:
	case <-j.C():
	}
}

// write handles a renewal of the node's Lease or a status write: relayed
// online; offline, or when the cloud does not answer, the Lease is
// answered locally and status writes are queued. A status write of an
// object that still has queued writes is queued behind them, so that the
// object's writes reach the cloud in order, without waiting for them.
func (p *Proxy) write(w http.ResponseWriter, r *http.Request, req request, healthy bool) string {
	body, err := readBody(r)
	if err != nil {
		writeStatus(w, http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge, nil, "%v", err)
		return servedError
	}
	lease := req.kind == kindLease
	if healthy && !lease && p.queue.Queued(writequeue.Object{Group: req.GVR.Group, Resource: req.GVR.Resource, Namespace: req.Namespace, Name: req.Name}) {
		p.queue.Kick()
		return p.queueStatus(w, r, req, body, "earlier status writes of this object are still queued for the cloud")
	}
	if healthy {
		up := p.upstreamRequest(r, body, answerFor(req.cacheWrites), req.GVR.GroupVersion())
		if lease {
			// Renewed by the node itself: no longer delegated.
			if b := withoutDelegateAnnotation(r.Header.Get("Content-Type"), body); b != nil {
				up = p.upstreamRequest(r, b, answerFor(req.cacheWrites), req.GVR.GroupVersion())
				up.Header.Set("Content-Type", "application/json")
			}
		}
		resp, err := p.rt.RoundTrip(up)
		if err == nil {
			defer resp.Body.Close()
			if b := p.relay(w, resp, answerFor(req.cacheWrites && resp.StatusCode < 300)); b != nil {
				go p.cacheResponse(req, false, resp.Header.Get("Content-Type"), b)
			}
			return servedUpstream
		}
		if r.Context().Err() != nil {
			return servedError
		}
		p.up.Kick()
		p.log.Debug("apiserver did not answer a write; answering it locally", "component", req.comp, "path", r.URL.Path, "err", err)
	}
	if lease {
		if j, err := bodyJSON(r.Header.Get("Content-Type"), body); err == nil {
			p.delegate(j)
		}
		return p.answerLease(w, r, req, body)
	}
	return p.queueStatus(w, r, req, body, unreachableMessage)
}

func readBody(r *http.Request) ([]byte, error) {
	var b bytes.Buffer
	n, err := b.ReadFrom(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("request body: %w", err)
	}
	if n == 0 {
		return []byte{}, nil
	}
	return b.Bytes(), nil
}

// answerLease renews the node's Lease locally: the Lease as sent, with its
// resourceVersion bumped, kept in the cache. kubelet only needs the
// renewal to succeed; the cloud sees the node's Lease again when it is
// back (kubelet's next renewal conflicts once, reads the Lease again and
// renews it upstream).
func (p *Proxy) answerLease(w http.ResponseWriter, r *http.Request, req request, body []byte) string {
	j, err := bodyJSON(r.Header.Get("Content-Type"), body)
	if err != nil {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, nil, "tether-edge: %v", err)
		return servedError
	}
	sent, err := localapi.DecodeObject(j, "Lease", leasesGVR.GroupVersion().String())
	if err == nil {
		err = notTheURLs(sent, req)
	}
	if err != nil {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, nil, "tether-edge: %v", err)
		return servedError
	}
	rv := sent.RV
	if old, _ := p.store.Get(req.comp, leasesGVR, req.Namespace, req.Name); old != nil {
		rv = max(rv, old.RV)
	}
	out, err := localapi.WithResourceVersion(sent.Raw, rv+1, "Lease", leasesGVR.GroupVersion().String())
	if err != nil {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, nil, "tether-edge: %v", err)
		return servedError
	}
	if o, err := localapi.DecodeObject(out, "", ""); err == nil {
		p.store.PutLocal(req.comp, leasesGVR, o)
		p.store.Sync() // a get right after sees it
		p.lastGet.Clear()
	}
	localapi.WriteJSON(w, http.StatusOK, out)
	return servedLocal
}

// queueStatus keeps a status write for replay and answers it with the
// object as the apiserver would have made it from the cached one: the
// status of an update put in, or the patch applied; resourceVersion
// bumped. why is why the write is not relayed (unreachableMessage, or
// earlier writes of the object are queued); refusals say it first.
func (p *Proxy) queueStatus(w http.ResponseWriter, r *http.Request, req request, body []byte, why string) string {
	refused := func(format string, args ...any) string {
		refuse(w, why, format, args...)
		return servedRefused
	}
	cached, _ := p.store.Get(req.comp, req.GVR, req.Namespace, req.Name)
	ct := r.Header.Get("Content-Type")
	var result, keep []byte
	var err error
	switch req.Verb {
	case localapi.VerbUpdate:
		if keep, err = bodyJSON(ct, body); err != nil {
			writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, nil, "tether-edge: %v", err)
			return servedError
		}
		ct = "application/json"
		result = keep
		if cached != nil {
			if result, err = withStatusOf(cached.Raw, keep); err != nil {
				writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, nil, "tether-edge: %v", err)
				return servedError
			}
		}
	case localapi.VerbPatch:
		if cached == nil {
			p.m.misses.WithLabelValues(req.comp).Inc()
			return refused("%s is not cached, so a patch of its status cannot be kept", describe(req, r))
		}
		if result, err = statuspatch.Apply(ct, cached.Raw, body, req.GVR.Resource); err != nil {
			return refused("the patch of %s cannot be applied by the edge: %v", describe(req, r), err)
		}
		keep = body
	}
	o, err := localapi.DecodeObject(result, "", "")
	if err == nil {
		err = notTheURLs(o, req)
	}
	if err != nil {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, nil, "tether-edge: %v", err)
		return servedError
	}
	rv := o.RV
	uid := o.UID
	if cached != nil {
		rv, uid = max(rv, cached.RV), cached.UID
	}
	kind, apiVersion := o.Kind, o.APIVersion
	if kind == "" && cached != nil {
		kind, apiVersion = cached.Kind, cached.APIVersion
	}
	if result, err = localapi.WithResourceVersion(result, rv+1, kind, apiVersion); err != nil {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, nil, "tether-edge: %v", err)
		return servedError
	}
	qw := &cache.QueuedWrite{
		Component: req.comp, UserAgent: r.UserAgent(),
		Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, ContentType: ct, Body: keep,
		Group: req.GVR.Group, Version: req.GVR.Version, Resource: req.GVR.Resource,
		Namespace: req.Namespace, Name: req.Name, UID: uid, QueuedAt: p.clock.Now(),
	}
	var base []byte
	if cached != nil {
		base = cached.Raw
	}
	if err := p.queue.Enqueue(qw, base, result); err != nil {
		p.log.Warn("status write refused: it cannot be queued", "component", req.comp, "object", describe(req, r), "err", err)
		if errors.Is(err, cache.ErrQueueFull) {
			return refused("the queue of status writes is full, this one is refused: %v", err)
		}
		return refused("the status write cannot be kept on disk: %v", err)
	}
	if o, err := localapi.DecodeObject(result, "", ""); err == nil {
		p.store.PutLocal(req.comp, req.GVR, o)
		p.store.Sync() // the next write of the object starts from this one
		p.lastGet.Clear()
	}
	p.queue.Kick()
	p.log.Debug("status write queued", "component", req.comp, "object", describe(req, r), "seq", qw.Seq)
	localapi.WriteJSON(w, http.StatusOK, result)
	return servedQueued
}

// notTheURLs refuses a written object (as sent, or as a patch made it)
// that is not the one the URL names, as kube-apiserver does: it would be
// kept in the cache as another object.
func notTheURLs(o *localapi.Object, req request) error {
	if o.Name != req.Name {
		return fmt.Errorf("the name of the object (%s) does not match the name on the URL (%s)", o.Name, req.Name)
	}
	if o.Namespace != req.Namespace {
		return fmt.Errorf("the namespace of the object (%q) does not match the namespace on the URL (%q)", o.Namespace, req.Namespace)
	}
	return nil
}
