package apiproxy

//lint:file-ignore SA1019 core/v1 Endpoints is deprecated but still served and read (kube-proxy, coredns and ingress controllers of older clusters); the topology filter must cover it.

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
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/edgeproxy/filter"
	"github.com/tether-edge/tether/internal/localapi"
)

// Topology is what the proxy needs of the service topology filter
// (package filter).
type Topology interface {
	// Apply filters an EndpointSlice or Endpoints in place.
	Apply(obj any) bool
	// WaitSynced waits up to d for the filter's state (Services, Nodes).
	WaitSynced(ctx context.Context, d time.Duration) bool
	// Subscribe delivers changes of the filter's state.
	Subscribe() (<-chan filter.Change, func())
}

var _ Topology = (*filter.Filter)(nil)

// DefaultTopologyComponents are the components whose endpoints are
// filtered by the Services' topology.
var DefaultTopologyComponents = []string{"kube-proxy", "coredns", "nginx-ingress-controller"}

// TopologyUserAgent is the component name of the filter's informers when
// they read through the proxy.
const TopologyUserAgent = "tether-edge-topology"

// TopologyClient is the filter's informers as an internal client
// (Loopback): their Services and Nodes are cached, so that the filter
// syncs from the cache offline.
var TopologyClient = Internal{Name: TopologyUserAgent, Cached: true}

var (
	endpointSlicesGVR = discoveryv1.SchemeGroupVersion.WithResource("endpointslices")
	endpointsGVR      = corev1.SchemeGroupVersion.WithResource("endpoints")
)

const (
	// topologySyncWait is how long a filtered request waits for the
	// filter's informers before it is answered 503 with Retry-After.
	topologySyncWait = 2 * time.Second
	topologyRetry    = "1"
)

// topologyNotSynced answers 503 with Retry-After: the filter cannot say
// yet which endpoints this node may see.
func topologyNotSynced(w http.ResponseWriter) {
	w.Header().Set("Retry-After", topologyRetry)
	writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, nil,
		"tether-edge: the service topology filter has not synced its Services and Nodes yet")
}

// objCodec reads and writes single objects in the media type of a
// response (protobuf or JSON).
type objCodec struct{ proto bool }

func (c objCodec) decode(raw []byte) (runtime.Object, error) {
	d := codecs.UniversalDeserializer()
	if c.proto {
		d = protobuf.Serializer
	}
	obj, gvk, err := d.Decode(raw, nil, nil)
	if err != nil {
		return nil, err
	}
	obj.GetObjectKind().SetGroupVersionKind(*gvk)
	return obj, nil
}

func (c objCodec) encode(obj runtime.Object) ([]byte, error) {
	if c.proto {
		var b bytes.Buffer
		err := protobuf.Serializer.Encode(obj, &b)
		return b.Bytes(), err
	}
	return json.Marshal(obj)
}

// filterBody filters a get or list answer of endpoints, and records the
// unfiltered objects for later re-sending.
func (p *Proxy) filterBody(contentType string, body []byte, f Topology) ([]byte, error) {
	c := objCodec{proto: mediaType(contentType) == runtime.ContentTypeProtobuf}
	obj, err := c.decode(body)
	if err != nil {
		return nil, fmt.Errorf("decode for the topology filter: %w", err)
	}
	if meta.IsListType(obj) {
		items, err := meta.ExtractList(obj)
		if err != nil {
			return nil, err
		}
		for _, it := range items {
			p.topoObjs.put(it.DeepCopyObject())
			f.Apply(it)
		}
		if err := meta.SetList(obj, items); err != nil {
			return nil, err
		}
	} else {
		p.topoObjs.put(obj.DeepCopyObject())
		f.Apply(obj)
	}
	b, err := c.encode(obj)
	if err == nil && !c.proto {
		b = append(b, '\n')
	}
	return b, err
}

// relayFiltered reads a whole get or list answer, filters it and writes
// it to the client; it returns the filtered body for the cache.
func (p *Proxy) relayFiltered(w http.ResponseWriter, resp *http.Response, f Topology) []byte {
	mt := mediaType(resp.Header.Get("Content-Type"))
	if resp.StatusCode != http.StatusOK || (mt != runtime.ContentTypeJSON && mt != runtime.ContentTypeProtobuf) {
		p.relay(w, resp, clientOnly)
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxCachedResponse+1))
	if err == nil && len(body) > maxCachedResponse {
		err = errors.New("answer too large to filter")
	}
	if err == nil {
		body, err = p.filterBody(resp.Header.Get("Content-Type"), body, f)
	}
	if err != nil {
		p.log.Warn("topology filter failed", "err", err)
		writeStatus(w, http.StatusBadGateway, metav1.StatusReasonInternalError, nil, "tether-edge: topology filter: %v", err)
		return nil
	}
	copyHeader(w.Header(), resp.Header)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	w.Write(body)
	return body
}

// topoObjects holds the last unfiltered EndpointSlices and Endpoints the
// proxy relayed (from any list, get or watch), by resource and key, so
// that open watches can be sent them filtered again when the filter's
// state changes.
type topoObjects struct {
	mu sync.Mutex
	m  map[schema.GroupVersionResource]map[string]topoObj
}

type topoObj struct {
	obj runtime.Object
	rv  uint64
	ns  string
	svc string // the Service it belongs to
}

// topoGVR returns the resource of an EndpointSlice or Endpoints and the
// Service it belongs to, and sets its kind (list items have none).
func topoGVR(obj runtime.Object) (schema.GroupVersionResource, string, bool) {
	switch o := obj.(type) {
	case *discoveryv1.EndpointSlice:
		o.SetGroupVersionKind(discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"))
		return endpointSlicesGVR, o.Labels[discoveryv1.LabelServiceName], true
	case *corev1.Endpoints:
		o.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Endpoints"))
		return endpointsGVR, o.Name, true
	}
	return schema.GroupVersionResource{}, "", false
}

func (s *topoObjects) put(obj runtime.Object) {
	gvr, svc, ok := topoGVR(obj)
	m, err := meta.Accessor(obj)
	if !ok || err != nil {
		return
	}
	rv := localapi.ParseRV(m.GetResourceVersion())
	key := m.GetNamespace() + "/" + m.GetName()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[schema.GroupVersionResource]map[string]topoObj{}
	}
	if s.m[gvr] == nil {
		s.m[gvr] = map[string]topoObj{}
	}
	if old, ok := s.m[gvr][key]; ok && old.rv > rv {
		return
	}
	s.m[gvr][key] = topoObj{obj: obj, rv: rv, ns: m.GetNamespace(), svc: svc}
}

func (s *topoObjects) delete(obj runtime.Object) {
	gvr, _, ok := topoGVR(obj)
	m, err := meta.Accessor(obj)
	if !ok || err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m[gvr], m.GetNamespace()+"/"+m.GetName())
}

// affected returns copies of the objects of gvr that change c may filter
// differently, no newer than maxRV.
func (s *topoObjects) affected(gvr schema.GroupVersionResource, c filter.Change, maxRV uint64) []runtime.Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []runtime.Object
	for _, o := range s.m[gvr] {
		if o.rv > maxRV || (!c.Pools && (o.ns != c.Namespace || o.svc != c.Service)) {
			continue
		}
		out = append(out, o.obj.DeepCopyObject())
	}
	return out
}

// topoWatch is one filtered watch being relayed: it filters each event
// and, when the filter's state changes, sends the affected objects again
// as MODIFIED.
type topoWatch struct {
	p      *Proxy
	filter Topology
	gvr    schema.GroupVersionResource
	scope  cache.Scope
	codec  objCodec
	wc     *watchCacher

	mu    sync.Mutex // held while writing to the client and caching what was written
	write func([]byte) error
	hwm   uint64            // largest resourceVersion sent on the stream
	sent  map[string]uint64 // key → hash of the filtered object last sent
}

// send filters one event of the stream, writes it to the client and
// caches it.
func (tw *topoWatch) send(ev []byte, cacheEv func() ([]byte, error)) error {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	if out, err := tw.filterEvent(ev); err != nil {
		tw.p.log.Debug("topology filter: event relayed unfiltered", "err", err)
		tw.p.m.cacheFailures.Inc()
	} else {
		ev, cacheEv = out, func() ([]byte, error) { return tw.cacheJSON(out) }
	}
	if err := tw.write(ev); err != nil {
		return err
	}
	// Cached under the lock re-sends hold too: the cache sees the events
	// in the order the client does.
	tw.wc.applyEvent(cacheEv)
	return nil
}

// cacheJSON is a filtered event as the cache reads it.
func (tw *topoWatch) cacheJSON(ev []byte) ([]byte, error) {
	if tw.codec.proto {
		return protobufEventJSON(ev[4:])
	}
	return ev, nil
}

// filterEvent filters one relayed event (a protobuf frame or a JSON line).
func (tw *topoWatch) filterEvent(ev []byte) ([]byte, error) {
	var typ string
	var raw []byte
	var pev metav1.WatchEvent
	if tw.codec.proto {
		if err := pev.Unmarshal(ev[4:]); err != nil {
			return nil, err
		}
		typ, raw = pev.Type, pev.Object.Raw
	} else {
		var jev watchEvent
		if err := json.Unmarshal(ev, &jev); err != nil {
			return nil, err
		}
		typ, raw = jev.Type, jev.Object
	}
	if typ == "ERROR" {
		return ev, nil
	}
	obj, err := tw.codec.decode(raw)
	if err != nil {
		return nil, err
	}
	if m, err := meta.Accessor(obj); err == nil {
		if rv := localapi.ParseRV(m.GetResourceVersion()); rv > tw.hwm {
			tw.hwm = rv
		}
	}
	switch typ {
	case "BOOKMARK":
		return ev, nil
	case "DELETED":
		tw.p.topoObjs.delete(obj)
		if m, err := meta.Accessor(obj); err == nil {
			delete(tw.sent, m.GetNamespace()+"/"+m.GetName())
		}
		return ev, nil
	}
	tw.p.topoObjs.put(obj.DeepCopyObject())
	out, _, err := tw.encodeEvent(typ, obj)
	return out, err
}

// encodeEvent filters obj and encodes it as an event of the stream; it
// records what was sent and returns whether it differs from the last.
func (tw *topoWatch) encodeEvent(typ string, obj runtime.Object) ([]byte, bool, error) {
	tw.filter.Apply(obj)
	b, err := tw.codec.encode(obj)
	if err != nil {
		return nil, false, err
	}
	m, _ := meta.Accessor(obj)
	key := m.GetNamespace() + "/" + m.GetName()
	h := maphash.Bytes(hashSeed, b)
	prev, seen := tw.sent[key]
	tw.sent[key] = h
	changed := !seen || prev != h
	if tw.codec.proto {
		ev := metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: b}}
		pb, err := ev.Marshal()
		if err != nil {
			return nil, false, err
		}
		frame := make([]byte, 4, 4+len(pb))
		binary.BigEndian.PutUint32(frame, uint32(len(pb)))
		return append(frame, pb...), changed, nil
	}
	out, err := json.Marshal(watchEvent{Type: typ, Object: b})
	return append(out, '\n'), changed, err
}

// resend sends the objects change c affects as MODIFIED events, filtered
// with the new state, when they differ from what the watch last sent.
// Only objects no newer than the stream's position are sent, so that a
// client resuming from an event's resourceVersion never skips one.
func (tw *topoWatch) resend(c filter.Change) error {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	for _, obj := range tw.p.topoObjs.affected(tw.gvr, c, tw.hwm) {
		j, err := json.Marshal(obj)
		if err != nil {
			continue
		}
		if o, err := localapi.DecodeObject(j, "", ""); err != nil || !tw.scope.Matches(o) {
			continue
		}
		ev, changed, err := tw.encodeEvent("MODIFIED", obj)
		if err != nil || !changed {
			continue
		}
		if err := tw.write(ev); err != nil {
			return err
		}
		if raw, err := tw.cacheJSON(ev); err == nil {
			tw.wc.apply(raw)
		}
	}
	return nil
}

// run re-sends on every change of the filter's state until ctx ends.
func (tw *topoWatch) run(ctx context.Context) {
	ch, stop := tw.filter.Subscribe()
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-ch:
			if tw.resend(c) != nil {
				return
			}
		}
	}
}
