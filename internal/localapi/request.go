package localapi

import (
	"net/http"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Verbs, as kube-apiserver names them.
const (
	VerbGet              = "get"
	VerbList             = "list"
	VerbWatch            = "watch"
	VerbCreate           = "create"
	VerbUpdate           = "update"
	VerbPatch            = "patch"
	VerbDelete           = "delete"
	VerbDeleteCollection = "deletecollection"
	VerbProxy            = "proxy" // non-resource requests and anything else
)

// Request is what a request asks for, much as kube-apiserver's
// RequestInfo: the API path parsed into verb, resource and object.
type Request struct {
	Verb string
	// Resource requests only.
	IsResource  bool
	GVR         schema.GroupVersionResource
	Subresource string
	Namespace   string
	Name        string
}

// ParseRequest parses an API path and method:
//
//	/api/v1[/namespaces/{ns}]/{resource}[/{name}[/{subresource}]]
//	/apis/{group}/{version}[/namespaces/{ns}]/{resource}[/{name}[/{subresource}]]
//	/api/v1/watch/...  (the deprecated watch paths)
//
// A GET or HEAD is a watch on a watch path or with watch=true, a get with
// a name, a list without. Anything else (discovery, /version, /openapi, a
// path with an empty segment such as /api/v1/namespaces//pods) is a
// non-resource request with verb "proxy". A watch of one object (the
// legacy watch path with a name) keeps its name: its Scope selects it.
func ParseRequest(r *http.Request) Request {
	parts := splitPath(r.URL.Path)
	if slices.Contains(parts, "") {
		return Request{Verb: VerbProxy}
	}
	var req Request
	var gv schema.GroupVersion
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		gv = schema.GroupVersion{Version: parts[1]}
		parts = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		gv = schema.GroupVersion{Group: parts[1], Version: parts[2]}
		parts = parts[3:]
	default:
		return Request{Verb: VerbProxy}
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
		return Request{Verb: VerbProxy}
	}
	req.IsResource = true
	req.GVR = gv.WithResource(parts[0])
	if len(parts) > 1 {
		req.Name = parts[1]
	}
	if len(parts) > 2 {
		req.Subresource = parts[2]
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		switch {
		case watchPath || IsTrue(r.URL.Query().Get("watch")):
			req.Verb = VerbWatch
		case req.Name != "":
			req.Verb = VerbGet
		default:
			req.Verb = VerbList
		}
	case http.MethodPost:
		req.Verb = VerbCreate
	case http.MethodPut:
		req.Verb = VerbUpdate
	case http.MethodPatch:
		req.Verb = VerbPatch
	case http.MethodDelete:
		req.Verb = VerbDelete
		if req.Name == "" {
			req.Verb = VerbDeleteCollection
		}
	default:
		req.Verb = VerbProxy
	}
	return req
}

func splitPath(p string) []string {
	p = strings.Trim(p, "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

// IsTrue reads a boolean query parameter (watch, sendInitialEvents):
// strconv.ParseBool's true, anything else false.
func IsTrue(s string) bool {
	b, _ := strconv.ParseBool(s)
	return b
}
