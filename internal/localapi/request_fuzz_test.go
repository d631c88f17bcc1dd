package localapi

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
)

// FuzzParseRequest reads arbitrary request lines as an HTTP server would,
// and parses them: nothing panics, and what is parsed holds together.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []struct{ method, target string }{
		{"GET", "/api/v1/namespaces/ns/pods/p"},
		{"GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn&labelSelector=app%3Dweb&watch=true&timeoutSeconds=5"},
		{"GET", "/api/v1/watch/namespaces/ns/pods/p"},
		{"PATCH", "/api/v1/namespaces/ns/pods/p/status"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n"},
		{"DELETE", "/api/v1/namespaces/ns/pods"},
		{"GET", "/apis/discovery.k8s.io/v1/endpointslices"},
		{"GET", "/api/v1/namespaces//pods"},
		{"GET", "/api/v1/pods//status"},
		{"GET", "//api/v1/../pods?labelSelector=a+in+("},
		{"GET", "/version"},
	} {
		f.Add(s.method, s.target)
	}
	f.Fuzz(func(t *testing.T, method, target string) {
		raw := method + " " + target + " HTTP/1.1\r\nHost: x\r\n\r\n"
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return // the server answers 400 before a handler sees it
		}
		req := ParseRequest(r)
		switch req.Verb {
		case VerbGet, VerbList, VerbWatch, VerbCreate, VerbUpdate, VerbPatch, VerbDelete, VerbDeleteCollection, VerbProxy:
		default:
			t.Fatalf("%s %s: verb %q", method, target, req.Verb)
		}
		if !req.IsResource {
			if req != (Request{Verb: VerbProxy}) {
				t.Fatalf("%s %s: a non-resource request with parts: %+v", method, target, req)
			}
			return
		}
		if req.GVR.Version == "" || req.GVR.Resource == "" {
			t.Fatalf("%s %s: resource request without version or resource: %+v", method, target, req)
		}
		if req.Subresource != "" && req.Name == "" {
			t.Fatalf("%s %s: a subresource of no object: %+v", method, target, req)
		}
		if req.Verb == VerbGet && req.Name == "" {
			t.Fatalf("%s %s: a get of no object: %+v", method, target, req)
		}
		for _, s := range []string{req.GVR.Group, req.GVR.Version, req.GVR.Resource, req.Namespace, req.Name, req.Subresource} {
			if strings.Contains(s, "/") {
				t.Fatalf("%s %s: a part with a slash: %+v", method, target, req)
			}
		}
		ParseScope(req.Namespace, req.Name, r.URL.Query()) // an error is answered 400
	})
}
