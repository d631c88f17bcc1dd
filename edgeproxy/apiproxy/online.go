package apiproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/localapi"
)

// readVia says where a cacheable read is relayed from.
type readVia uint8

const (
	viaCloud readVia = iota // the cloud's kube-apiserver
	viaPool                 // the node pool's replica (poolstore), on the leader
)

// forwardRead relays a get or list from the cloud or the node pool's
// replica (via) and caches the answer. When that does not answer at all
// it is served from the cache.
func (p *Proxy) forwardRead(w http.ResponseWriter, r *http.Request, req request, via readVia) string {
	resp, err := p.readTrip(r, req, via)
	if err != nil {
		if r.Context().Err() != nil {
			return servedError
		}
		p.up.Kick()
		p.log.Debug("apiserver did not answer; serving from the cache", "component", req.comp, "path", r.URL.Path, "err", err)
		return p.serveRead(w, r, req, noAnswer(err))
	}
	defer resp.Body.Close()
	getKey := req.comp + " " + r.URL.Path
	if resp.StatusCode == http.StatusNotFound && req.Verb == localapi.VerbGet {
		p.store.Forget(req.comp, req.GVR, req.Namespace, req.Name)
		p.lastGet.Delete(getKey)
	}
	cacheIt := resp.StatusCode == http.StatusOK && req.scopeErr == nil
	var body []byte
	if req.filtered {
		// Filters run before the cache: it holds what the client got.
		if body = p.relayFiltered(w, resp, req.filter); !cacheIt {
			body = nil
		}
	} else {
		body = p.relay(w, resp, answerFor(cacheIt))
	}
	if body != nil {
		if req.Verb == localapi.VerbGet {
			// The same answer as last time needs no decoding again.
			h := maphash.Bytes(hashSeed, body)
			if prev, ok := p.lastGet.Swap(getKey, h); ok && prev.(uint64) == h {
				return servedUpstream
			}
		}
		complete := !r.URL.Query().Has("continue")
		go p.cacheResponse(req, complete, resp.Header.Get("Content-Type"), body)
	}
	return servedUpstream
}

var hashSeed = maphash.MakeSeed()

// readTrip sends a cacheable read to the cloud or to the node pool's
// replica (via).
//
// A body of the client's is not sent: kube-apiserver ignores the body of
// a get, list or watch (and the read transport takes none).
func (p *Proxy) readTrip(r *http.Request, req request, via readVia) (*http.Response, error) {
	if via == viaPool {
		return p.pool.Transport().RoundTrip(withoutBody(poolRequest(r)))
	}
	rt := p.rt
	if req.Verb != localapi.VerbWatch {
		rt = p.reads
	}
	return rt.RoundTrip(withoutBody(p.upstreamRequest(r, nil, clientAndCache, req.GVR.GroupVersion())))
}

// withoutBody drops the body of a request the proxy made from a client's.
func withoutBody(r *http.Request) *http.Request {
	r.Body, r.GetBody, r.ContentLength = http.NoBody, nil, 0
	r.Header.Del("Content-Length")
	r.Header.Del("Content-Type")
	return r
}

// relay copies an upstream response to the client. For the cache too, and
// with a JSON or protobuf body, it returns a copy of the body once it was
// relayed whole.
func (p *Proxy) relay(w http.ResponseWriter, resp *http.Response, to answerFor) []byte {
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	if mt := mediaType(resp.Header.Get("Content-Type")); to == clientOnly || (mt != runtime.ContentTypeJSON && mt != runtime.ContentTypeProtobuf) {
		io.Copy(w, resp.Body)
		return nil
	}
	var buf bytes.Buffer
	if resp.ContentLength > 0 && resp.ContentLength < maxCachedResponse {
		buf.Grow(int(resp.ContentLength))
	}
	lw := &limitedBuffer{buf: &buf, max: maxCachedResponse}
	cb := copyBufs.Get().(*[32 << 10]byte)
	_, err := io.CopyBuffer(io.MultiWriter(w, lw), resp.Body, cb[:])
	copyBufs.Put(cb)
	if err != nil || lw.over {
		return nil
	}
	return buf.Bytes()
}

// copyBufs are relay's copy buffers: io.Copy would allocate 32 KiB for
// each response, most of a proxied GET's garbage.
var copyBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

type limitedBuffer struct {
	buf  *bytes.Buffer
	max  int
	over bool
}

func (l *limitedBuffer) Write(b []byte) (int, error) {
	if !l.over && l.buf.Len()+len(b) <= l.max {
		l.buf.Write(b)
	} else if !l.over {
		l.over = true
		l.buf.Reset()
	}
	return len(b), nil
}

// cacheResponse caches the body of a get, list, or write response.
func (p *Proxy) cacheResponse(req request, complete bool, contentType string, body []byte) {
	d, err := decodeBody(contentType, body)
	if err != nil {
		p.m.cacheFailures.Inc()
		p.log.Debug("response not cached", "component", req.comp, "resource", req.GVR.String(), "err", err)
		return
	}
	if !d.list {
		if d.kind == "Status" {
			return // a delete's answer
		}
		o, err := localapi.DecodeObject(d.object, d.kind, d.apiVersion)
		if err == nil {
			err = p.store.Put(req.comp, req.GVR, o)
		}
		if err != nil {
			p.m.cacheFailures.Inc()
		}
		return
	}
	list := cache.List{Kind: d.kind, APIVersion: d.apiVersion, RV: localapi.ParseRV(d.rv),
		Scope: req.scope, Complete: complete && d.cont == "", Items: make([]*localapi.Object, 0, len(d.items))}
	for _, raw := range d.items {
		o, err := localapi.DecodeObject(raw, d.kind, d.apiVersion)
		if err != nil {
			p.m.cacheFailures.Inc()
			list.Complete = false // do not prune what may be this one
			continue
		}
		list.Items = append(list.Items, o)
	}
	if err := p.store.ApplyList(req.comp, req.GVR, list); err != nil {
		p.m.cacheFailures.Inc()
	}
}

// forwardWatch relays a watch from the cloud event by event, caching each
// event. If the cloud goes away mid-watch, the client's watch is held
// open without events (see hold) instead of being broken; if the cloud
// does not answer at all, the watch is served offline.
func (p *Proxy) forwardWatch(w http.ResponseWriter, r *http.Request, req request, via readVia) string {
	start := p.clock.Now()
	if via == viaPool {
		ctx, stop := p.whilePoolServes(r.Context(), req.GVR)
		defer stop()
		r = r.WithContext(ctx)
	}
	resp, err := p.readTrip(r, req, via)
	if err != nil {
		if r.Context().Err() != nil {
			return servedError
		}
		p.up.Kick()
		p.log.Debug("apiserver did not answer a watch; serving it offline", "component", req.comp, "path", r.URL.Path, "err", err)
		return p.serveWatch(w, r, req, start, cloudSilent, noAnswer(err))
	}
	defer resp.Body.Close()
	rc := http.NewResponseController(w)
	mt := mediaType(resp.Header.Get("Content-Type"))
	if resp.StatusCode != http.StatusOK || req.scopeErr != nil || (mt != runtime.ContentTypeJSON && mt != runtime.ContentTypeProtobuf) {
		copyHeader(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		rc.Flush()
		io.Copy(flushWriter{w, rc}, resp.Body)
		return servedUpstream
	}
	copyHeader(w.Header(), resp.Header)
	w.Header().Del("Content-Length")
	w.WriteHeader(http.StatusOK)
	rc.Flush()

	open := p.m.watchesOpen.WithLabelValues("upstream")
	open.Inc()
	defer open.Dec()
	wc := &watchCacher{p: p, comp: req.comp, gvr: req.GVR, scope: req.scope}
	if localapi.IsTrue(r.URL.Query().Get("sendInitialEvents")) {
		wc.seen = map[string]bool{}
	}
	// Events are relayed whole, one at a time, so that a stream cut in
	// the middle of one leaves the client with whole events only.
	next := jsonEvents(resp.Body)
	if mt == runtime.ContentTypeProtobuf {
		next = protobufFrames(resp.Body)
	}
	send := func(ev []byte) error {
		_, err := w.Write(ev)
		rc.Flush()
		return err
	}
	var tw *topoWatch
	if req.filtered {
		tw = &topoWatch{p: p, filter: req.filter, gvr: req.GVR, scope: req.scope, codec: objCodec{proto: mt == runtime.ContentTypeProtobuf},
			wc: wc, write: send, hwm: localapi.ParseRV(r.URL.Query().Get("resourceVersion")), sent: map[string]uint64{}}
		ctx, cancel := context.WithCancel(r.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			tw.run(ctx)
		}()
		// No re-send may write once the handler has returned.
		defer func() { cancel(); <-done }()
	}
	for {
		ev, cacheEv, err := next()
		if err != nil {
			if r.Context().Err() != nil || errors.Is(err, io.EOF) {
				return servedUpstream // client gone, or the apiserver ended the watch
			}
			p.up.Kick()
			p.log.Debug("watch from the apiserver broke; holding the client's watch open", "component", req.comp, "path", r.URL.Path, "err", err)
			open.Dec()
			p.hold(r, start, cloudSilent)
			open.Inc()
			return servedUpstream
		}
		if tw != nil {
			err = tw.send(ev, cacheEv)
		} else if err = send(ev); err == nil {
			wc.applyEvent(cacheEv)
		}
		if err != nil {
			return servedUpstream
		}
	}
}

// eventReader returns the next event of a watch stream as relayed bytes,
// and a function that returns it as the JSON event the cache reads.
type eventReader func() (relay []byte, cacheEvent func() ([]byte, error), err error)

// jsonEvents reads a JSON watch stream: one JSON object per event.
func jsonEvents(body io.Reader) eventReader {
	dec := json.NewDecoder(body)
	return func() ([]byte, func() ([]byte, error), error) {
		var ev json.RawMessage
		if err := dec.Decode(&ev); err != nil {
			return nil, nil, err
		}
		return append(ev, '\n'), func() ([]byte, error) { return ev, nil }, nil
	}
}

// maxFrame bounds one frame of a protobuf watch stream.
const maxFrame = 64 << 20

// protobufFrames reads a protobuf watch stream: frames of a 4-byte
// big-endian length and a metav1.WatchEvent.
func protobufFrames(body io.Reader) eventReader {
	return func() ([]byte, func() ([]byte, error), error) {
		var hdr [4]byte
		if _, err := io.ReadFull(body, hdr[:]); err != nil {
			return nil, nil, err // io.EOF between frames: the watch ended
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > maxFrame {
			return nil, nil, fmt.Errorf("watch frame of %d bytes", n)
		}
		frame := make([]byte, 4+n)
		copy(frame, hdr[:])
		if _, err := io.ReadFull(body, frame[4:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, nil, err
		}
		return frame, func() ([]byte, error) { return protobufEventJSON(frame[4:]) }, nil
	}
}

type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	f.rc.Flush()
	return n, err
}

// watchEvent is one event of a JSON watch stream.
type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// watchCacher applies a watch's events to the cache.
type watchCacher struct {
	p     *Proxy
	comp  string
	gvr   schema.GroupVersionResource
	scope cache.Scope
	// seen collects the keys of the initial events of a watch with
	// sendInitialEvents, until the bookmark that ends them.
	seen map[string]bool
}

// applyEvent applies the event cacheEv returns.
func (wc *watchCacher) applyEvent(cacheEv func() ([]byte, error)) {
	raw, err := cacheEv()
	if err != nil {
		wc.p.m.cacheFailures.Inc()
		return
	}
	wc.apply(raw)
}

func (wc *watchCacher) apply(raw []byte) {
	var ev watchEvent
	if err := json.Unmarshal(raw, &ev); err != nil {
		wc.p.m.cacheFailures.Inc()
		return
	}
	var err error
	switch ev.Type {
	case localapi.Added, localapi.Modified:
		var o *localapi.Object
		if o, err = localapi.DecodeObject(ev.Object, "", ""); err == nil {
			err = wc.p.store.Put(wc.comp, wc.gvr, o)
			if wc.seen != nil {
				wc.seen[o.Key()] = true
			}
		}
	case localapi.Deleted:
		// With selectors, DELETED also means "no longer selected": the
		// object goes from the cache, but without a tombstone.
		var o *localapi.Object
		if o, err = localapi.DecodeObject(ev.Object, "", ""); err == nil {
			err = wc.p.store.Delete(wc.comp, wc.gvr, o, !wc.scope.Selective())
			wc.podDeleted(o)
		}
	case localapi.Bookmark:
		var b localapi.BookmarkInfo
		if b, err = localapi.ReadBookmark(ev.Object); err == nil {
			err = wc.p.store.Bookmark(wc.comp, wc.gvr, b.Kind, b.APIVersion, b.RV)
			if wc.seen != nil && b.Marks == localapi.InitialEventsEnd {
				err = errors.Join(err, wc.p.store.Prune(wc.comp, wc.gvr, wc.scope, b.RV, wc.seen))
				wc.seen = nil
			}
		}
	}
	if err != nil {
		wc.p.m.cacheFailures.Inc()
	}
}
