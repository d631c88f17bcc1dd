package apiproxy

import (
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/localapi"
)

// request is what the proxy reads from a client's request: the API path
// parsed into verb, resource and object (localapi.ParseRequest), with
// what the proxy asks of it.
type request struct{ localapi.Request }

// parseRequest parses an API path as localapi.ParseRequest does:
// anything but a resource request is verb "proxy", relayed as it is and
// refused offline. A watch of one object (the legacy watch path with a
// name) is covered by its scope (see scope).
func parseRequest(r *http.Request) request {
	return request{localapi.ParseRequest(r)}
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
	case localapi.VerbGet, localapi.VerbList, localapi.VerbWatch:
	default:
		return false
	}
	return !strings.Contains(r.Header.Get("Accept"), "as=")
}

// scope returns the namespace and selectors of a list or watch.
func (req request) scope(r *http.Request) (cache.Scope, error) {
	return localapi.ParseScope(req.Namespace, req.Name, r.URL.Query())
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
