package apiproxy

import (
	"bufio"
	"net/http"
	"strings"
	"testing"

	"github.com/tether-edge/tether/internal/localapi"
)

// FuzzParseRequest reads arbitrary request lines and headers as the
// proxy's server would, and reads them as the proxy does: nothing
// panics, and what the proxy makes of them holds together.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []struct{ method, target, accept string }{
		{"GET", "/api/v1/namespaces/ns/pods/p", "application/json"},
		{"GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn&labelSelector=app%3Dweb&watch=true&timeoutSeconds=5", ""},
		{"GET", "/api/v1/watch/namespaces/ns/pods/p", ""},
		{"PATCH", "/api/v1/namespaces/ns/pods/p/status", ""},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n", "application/vnd.kubernetes.protobuf"},
		{"DELETE", "/api/v1/namespaces/ns/pods", ""},
		{"GET", "/apis/discovery.k8s.io/v1/endpointslices", "application/json;as=Table;v=v1;g=meta.k8s.io"},
		{"GET", "/api/v1/namespaces//pods", ""},
		{"GET", "/api/v1/pods//status", ""},
		{"GET", "//api/v1/../pods?labelSelector=a+in+(", ""},
		{"GET", "/version", ""},
	} {
		f.Add(s.method, s.target, s.accept)
	}
	p := &Proxy{node: "n", cached: map[string]bool{"kubelet": true}}
	f.Fuzz(func(t *testing.T, method, target, accept string) {
		raw := method + " " + target + " HTTP/1.1\r\nHost: x\r\nAccept: " + accept + "\r\nUser-Agent: kubelet/v1\r\n\r\n"
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return // the server answers 400 before the proxy sees it
		}
		req := p.classify(r) // the parse's own invariants: localapi's FuzzParseRequest
		switch req.kind {
		case kindStatus:
			if req.Name == "" || req.Subresource != "status" {
				t.Fatalf("%s %s: a status write of no object: %+v", method, target, req)
			}
		case kindRead, kindWatch:
			if !cacheable(req.Request, r) || (req.kind == kindWatch) != (req.Verb == localapi.VerbWatch) {
				t.Fatalf("%s %s: answered from the cache as %v: %+v", method, target, req.kind, req)
			}
		case kindLease:
			if req.Name != "n" || req.Namespace != "kube-node-lease" {
				t.Fatalf("%s %s: a renewal of another Lease: %+v", method, target, req)
			}
		}
		if req.comp != "kubelet" || req.label != "kubelet" || req.pool || req.filtered {
			t.Fatalf("%s %s: from kubelet, classified as %+v", method, target, req)
		}
		watchTimeout(r)
		describe(req, r)
		component(r.UserAgent())
		isUpgrade(r)
	})
}
