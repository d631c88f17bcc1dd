package apiproxy

import (
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/edgeproxy/cache"
)

// Verbs, as kube-apiserver names them.
const (
	verbGet              = "get"
	verbList             = "list"
	verbWatch            = "watch"
	verbCreate           = "create"
	verbUpdate           = "update"
	verbPatch            = "patch"
	verbDelete           = "delete"
	verbDeleteCollection = "deletecollection"
	verbProxy            = "proxy" // non-resource requests and anything else
)

// request is what the proxy reads from a client's request, much as
// kube-apiserver's RequestInfo: the API path parsed into verb, resource
// and object.
type request struct {
	Verb string
	// Resource requests only.
	IsResource  bool
	GVR         schema.GroupVersionResource
	Subresource string
	Namespace   string
	Name        string
}

// parseRequest parses an API path:
//
//	/api/v1[/namespaces/{ns}]/{resource}[/{name}[/{subresource}]]
//	/apis/{group}/{version}[/namespaces/{ns}]/{resource}[/{name}[/{subresource}]]
//	/api/v1/watch/...  (the deprecated watch paths)
//
// Anything else (discovery, /version, /openapi, a path with an empty
// segment such as /api/v1/namespaces//pods) is a non-resource request
// with verb "proxy": relayed as it is, refused offline.
func parseRequest(r *http.Request) request {
	parts := splitPath(r.URL.Path)
	if slices.Contains(parts, "") {
		return request{Verb: verbProxy}
	}
	var req request
	var gv schema.GroupVersion
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		gv = schema.GroupVersion{Version: parts[1]}
		parts = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		gv = schema.GroupVersion{Group: parts[1], Version: parts[2]}
		parts = parts[3:]
	default:
		return request{Verb: verbProxy}
	}
	watchPath := false
	if parts[0] == "watch" {
		watchPath = true
		parts = parts[1:]
	}
	// namespaces/{ns}/{resource}...; a bare namespaces or namespaces/{ns}
	// is the namespaces resource itself.
	if len(parts) >= 3 && parts[0] == "namespaces" && parts[2] != "status" && parts[2] != "finalize" {
		req.Namespace = parts[1]
		parts = parts[2:]
	}
	if len(parts) == 0 || len(parts) > 3 {
		return request{Verb: verbProxy}
	}
	req.IsResource = true
	req.GVR = gv.WithResource(parts[0])
	if len(parts) > 1 {
		req.Name = parts[1]
	}
	if len(parts) > 2 {
		req.Subresource = parts[2]
	}
	q := r.URL.Query()
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		switch {
		case watchPath || isTrue(q.Get("watch")):
			req.Verb = verbWatch
		case req.Name != "":
			req.Verb = verbGet
		default:
			req.Verb = verbList
		}
	case http.MethodPost:
		req.Verb = verbCreate
	case http.MethodPut:
		req.Verb = verbUpdate
	case http.MethodPatch:
		req.Verb = verbPatch
	case http.MethodDelete:
		req.Verb = verbDelete
		if req.Name == "" {
			req.Verb = verbDeleteCollection
		}
	default:
		req.Verb = verbProxy
	}
	// A watch of one object: the legacy watch path with a name, or a
	// watch with a metadata.name field selector, are both covered by
	// the scope (see scope).
	return req
}

func splitPath(p string) []string {
	p = strings.Trim(p, "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

func isTrue(s string) bool {
	b, _ := strconv.ParseBool(s)
	return b
}

// cacheable reports whether the response to req can be cached and the
// request answered from the cache: a get, list or watch of a resource
// itself (no subresource) that asks for whole objects (not a Table or
// PartialObjectMetadata view).
func (req request) cacheable(r *http.Request) bool {
	if !req.IsResource || req.Subresource != "" {
		return false
	}
	switch req.Verb {
	case verbGet, verbList, verbWatch:
	default:
		return false
	}
	return !strings.Contains(r.Header.Get("Accept"), "as=")
}

// scope returns the namespace and selectors of a list or watch.
func (req request) scope(r *http.Request) (cache.Scope, error) {
	q := r.URL.Query()
	s := cache.Scope{Namespace: req.Namespace}
	var err error
	if s.Labels, err = labels.Parse(q.Get("labelSelector")); err != nil {
		return s, fmt.Errorf("labelSelector: %w", err)
	}
	if s.Fields, err = fields.ParseSelector(q.Get("fieldSelector")); err != nil {
		return s, fmt.Errorf("fieldSelector: %w", err)
	}
	if req.Name != "" { // the legacy watch path of one object
		s.Fields = fields.AndSelectors(s.Fields, fields.OneTermEqualSelector("metadata.name", req.Name))
	}
	return s, nil
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
func mediaType(contentType string) string {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return contentType
	}
	return mt
}

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
