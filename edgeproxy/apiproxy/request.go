package apiproxy

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tether-edge/tether/edgeproxy/apiproxy/internal/statuspatch"
	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/localapi"
)

// kind is what the proxy does with a request, online and offline.
type kind uint8

const (
	// kindOther: relayed as it is (a reverse proxy); refused offline.
	kindOther kind = iota
	// kindUpgrade: a protocol upgrade (exec, attach, port-forward),
	// relayed over HTTP/1.1; refused offline.
	kindUpgrade
	// kindRead: a get or list whose answer is cached: relayed and
	// cached; answered from the cache offline.
	kindRead
	// kindWatch: a watch whose events are cached: relayed event by event
	// and cached; held open offline.
	kindWatch
	// kindLease: a renewal of this node's Lease: relayed; answered
	// locally offline.
	kindLease
	// kindStatus: a status write of a pod or a node: relayed; queued
	// offline, or while earlier writes of the object are queued.
	kindStatus
	// kindToken: a TokenRequest of a cached component: relayed and the
	// answer kept; offline, the last answer of the cloud (token.go).
	kindToken
	// kindRegister: a create of a Node, or a create or update of a
	// CSINode, by a cached component: relayed and its answer cached;
	// offline, a create of this node's cached Node is answered 409
	// AlreadyExists, anything else refused (register.go).
	kindRegister
)

// request is a client's request, classified once (Proxy.classify): the
// API path parsed into verb, resource and object (localapi.ParseRequest),
// who sent it, and what the proxy does with it. The rest of the proxy
// reads it; nothing after classify looks at the User-Agent, the
// context's Internal or the Accept header to learn what the request is.
type request struct {
	localapi.Request
	kind kind
	// comp is the component that sent it: an internal client's name, or
	// the first word of the User-Agent.
	comp string
	// label is comp in metrics: "other" for a client of the listener
	// whose reads are not cached and that is not one of the defaults.
	label string
	// filtered: a get, list or watch of EndpointSlices or Endpoints by a
	// topology component, or of Services by the kubelet while the pod
	// listener is on, filtered before the cache by filter (topology.go,
	// podservice.go).
	filtered bool
	filter   Topology
	// pool: a list or watch that the node pool's replica answers while
	// it serves the resource (viapool.go).
	pool bool
	// cacheWrites: comp is one of the cached components
	// (Options.Components): the answer to its write is cached.
	cacheWrites bool
	// scope is the namespace and selectors of a cached read or watch;
	// scopeErr says they do not parse (answered 400 offline, relayed
	// but not cached online).
	scope    cache.Scope
	scopeErr error
}

// parseRequest parses an API path as localapi.ParseRequest does:
// anything but a resource request is verb "proxy", relayed as it is and
// refused offline. A watch of one object (the legacy watch path with a
// name) is covered by its scope (see localapi.ParseScope).
func parseRequest(r *http.Request) localapi.Request {
	return localapi.ParseRequest(r)
}

// classify reads r once into what the proxy does with it.
func (p *Proxy) classify(r *http.Request) request {
	req := request{Request: parseRequest(r), comp: component(r.UserAgent())}
	in := internalOf(r)
	caches := p.cached[req.comp]
	if in != nil {
		req.comp, caches = in.Name, in.Cached
	}
	req.label = req.comp
	if in == nil && !p.cached[req.comp] && !slices.Contains(DefaultComponents, req.comp) {
		req.label = "other"
	}
	req.cacheWrites = p.cached[req.comp]
	cacheable := cacheable(req.Request, r)
	switch {
	case !cacheable:
	case p.topo != nil && p.topoComps[req.comp] && (req.GVR == endpointSlicesGVR || req.GVR == endpointsGVR):
		req.filtered, req.filter = true, p.topo
	case p.podService != nil && in == nil && req.comp == "kubelet" && req.GVR == servicesGVR:
		req.filtered, req.filter = true, p.podService
	}
	cached := cacheable && (caches || req.filtered)
	req.pool = cached && p.pool != nil && (in == nil || !in.NotFromPool) &&
		(req.Verb == localapi.VerbList || req.Verb == localapi.VerbWatch)
	if cached {
		req.scope, req.scopeErr = localapi.ParseScope(req.Namespace, req.Name, r.URL.Query())
	}
	switch {
	case isUpgrade(r):
		req.kind = kindUpgrade
	case cached && req.Verb == localapi.VerbWatch:
		req.kind = kindWatch
	case cached:
		req.kind = kindRead
	case p.isNodeLease(req.Request):
		req.kind = kindLease
	case isStatusWrite(req.Request):
		req.kind = kindStatus
	case req.cacheWrites && isTokenRequest(req.Request):
		req.kind = kindToken
	case req.cacheWrites && isRegistration(req.Request):
		req.kind = kindRegister
	default:
		req.kind = kindOther
	}
	return req
}

// cacheable reports whether the response to req can be cached and the
// request answered from the cache: a get, list or watch of a resource
// itself (no subresource) that asks for whole objects (not a Table or
// PartialObjectMetadata view).
func cacheable(req localapi.Request, r *http.Request) bool {
	if !req.IsResource || req.Subresource != "" {
		return false
	}
	switch req.Verb {
	case localapi.VerbGet, localapi.VerbList, localapi.VerbWatch:
	default:
		return false
	}
	return !strings.Contains(r.Header.Get("Accept"), "as=")
}

// isNodeLease reports whether req renews this node's Lease.
func (p *Proxy) isNodeLease(req localapi.Request) bool {
	return p.node != "" && req.Verb == localapi.VerbUpdate && req.GVR == leasesGVR && req.Subresource == "" &&
		req.Namespace == "kube-node-lease" && req.Name == p.node
}

// isStatusWrite reports whether req writes the status of a Pod or a Node.
func isStatusWrite(req localapi.Request) bool {
	return (req.Verb == localapi.VerbUpdate || req.Verb == localapi.VerbPatch) && req.Subresource == "status" &&
		(req.GVR == podsGVR || req.GVR == nodesGVR)
}

// watchTimeout is the watch's timeoutSeconds (0 if none).
func watchTimeout(r *http.Request) time.Duration {
	n, err := strconv.ParseInt(r.URL.Query().Get("timeoutSeconds"), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// component is the first word of a User-Agent up to its slash:
// "kubelet/v1.36.3 (linux/amd64) kubernetes/abc" is kubelet. It is also
// the field manager kube-apiserver derives from the User-Agent.
func component(userAgent string) string {
	c, _, _ := strings.Cut(userAgent, "/")
	c, _, _ = strings.Cut(c, " ")
	return strings.ToLower(c)
}

// mediaType is a Content-Type without its parameters.
func mediaType(contentType string) string { return statuspatch.MediaType(contentType) }

// isUpgrade reports whether r asks for a protocol upgrade (exec, attach,
// port-forward over SPDY or WebSocket).
func isUpgrade(r *http.Request) bool {
	for _, v := range r.Header.Values("Connection") {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}
