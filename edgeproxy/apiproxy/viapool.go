package apiproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/ticker"
)

// Pool is what the proxy needs of the node pool (package poolstore): the
// pool-scope resources replicated from the pool's leader, and the way to
// the leader for the node's heartbeats while the cloud is unreachable.
type Pool interface {
	// Serves reports whether a list or watch of gvr is answered from the
	// pool's replica now: while the leader's sync is fresh, or, with the
	// cloud unreachable, whenever the replica has the resource.
	Serves(gvr schema.GroupVersionResource, cloudHealthy bool) bool
	// Transport answers list and watch of pool-scope resources from the
	// replica (JSON, kube-apiserver semantics).
	Transport() http.RoundTripper
	// DelegateHeartbeat sends this node's Lease (JSON) to the pool
	// leader, which has it written in the cloud.
	DelegateHeartbeat(ctx context.Context, lease []byte) error
}

// PoolUserAgent is the component name of the pool's own requests through
// the proxy (election, the leader's watches).
const PoolUserAgent = "tether-edge-pool"

// The node pool's internal clients (Loopback). The pool's own requests
// are never answered from the pool, and not cached: the leader's watches
// fill the replica, and the election must see the cloud's records, not a
// copy. Its Node informer is cached, so that a node restarted without the
// cloud still knows its peers (and starts its pool).
var (
	PoolClient        = Internal{Name: PoolUserAgent, NotFromPool: true}
	PoolMembersClient = Internal{Name: PoolUserAgent + "-members", Cached: true, NotFromPool: true}
)

// DelegateHeartbeatAnnotation marks a Lease the gateway wrote for a node
// that lost the cloud (docs/design.md, "Labels and annotations").
const DelegateHeartbeatAnnotation = openyurt.DelegateHeartbeatAnnotation

// servedPool: answered from the node pool's replica.
const servedPool = "pool"

// delegateTimeout bounds one delegated heartbeat.
const delegateTimeout = 5 * time.Second

// whilePoolServes returns a context that ends when ctx does or when the
// pool's replica stops being the answer for gvr: the leader's sync went
// stale while this node reaches the cloud. A watch served from the
// replica then ends, and the client watches again, from the cloud, from
// its last resourceVersion (the replica keeps the cloud's), instead of
// waiting for changes the replica no longer gets until its timeout. It is
// checked every HeldWatchRecheck.
func (p *Proxy) whilePoolServes(ctx context.Context, gvr schema.GroupVersionResource) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker.Every(ctx, p.clock, p.recheck, func() bool {
			if p.pool.Serves(gvr, p.up.Healthy()) {
				return true
			}
			p.log.Debug("the pool's replica no longer serves; ending a watch served from it", "resource", gvr.String())
			p.m.poolWatchesEnded.Inc()
			cancel()
			return false
		})
	}()
	return ctx, func() { cancel(); <-done }
}

// poolRequest is r for the pool's transport: the same path and query,
// answered in JSON.
func poolRequest(r *http.Request) *http.Request {
	out := r.Clone(r.Context())
	out.URL = &url.URL{Scheme: "http", Host: "pool", Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	out.Host, out.RequestURI = "", ""
	out.Header.Del("Authorization")
	out.Header.Set("Accept", "application/json")
	return out
}

// delegate sends the node's Lease renewal to the pool leader, in the
// background: the renewal was answered locally already, and kubelet's
// next one comes in seconds. One at a time; a renewal that finds one in
// flight is dropped.
func (p *Proxy) delegate(body []byte) {
	if p.pool == nil {
		return
	}
	select {
	case p.delegating <- struct{}{}:
	default:
		p.m.delegated.WithLabelValues("dropped").Inc()
		return
	}
	go func() {
		defer func() { <-p.delegating }()
		ctx, cancel := context.WithTimeout(context.Background(), delegateTimeout)
		defer cancel()
		if err := p.pool.DelegateHeartbeat(ctx, body); err != nil {
			p.m.delegated.WithLabelValues("failed").Inc()
			p.log.Debug("heartbeat not delegated to the pool leader", "err", err)
			return
		}
		p.m.delegated.WithLabelValues("ok").Inc()
	}()
}

// withoutDelegateAnnotation returns the Lease body without the
// delegated-heartbeat annotation, as JSON, when it has it (kubelet sends
// back the Lease it last read, which the gateway may have written);
// otherwise nil.
func withoutDelegateAnnotation(contentType string, body []byte) []byte {
	j, err := bodyJSON(contentType, body)
	if err != nil || !bytes.Contains(j, []byte(DelegateHeartbeatAnnotation)) {
		return nil
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(j, &obj) != nil {
		return nil
	}
	var meta map[string]json.RawMessage
	if json.Unmarshal(obj["metadata"], &meta) != nil {
		return nil
	}
	var ann map[string]string
	if json.Unmarshal(meta["annotations"], &ann) != nil {
		return nil
	}
	delete(ann, DelegateHeartbeatAnnotation)
	if len(ann) == 0 {
		delete(meta, "annotations")
	} else {
		meta["annotations"], _ = json.Marshal(ann)
	}
	obj["metadata"], _ = json.Marshal(meta)
	out, err := json.Marshal(obj)
	if err != nil {
		return nil
	}
	return out
}
