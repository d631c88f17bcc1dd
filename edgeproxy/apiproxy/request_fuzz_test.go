package apiproxy

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
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
	f.Fuzz(func(t *testing.T, method, target, accept string) {
		raw := method + " " + target + " HTTP/1.1\r\nHost: x\r\nAccept: " + accept + "\r\nUser-Agent: kubelet/v1\r\n\r\n"
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return // the server answers 400 before the proxy sees it
		}
		req := parseRequest(r) // its own invariants: localapi's FuzzParseRequest
		if isStatusWrite(req) && (req.Name == "" || req.Subresource != "status") {
			t.Fatalf("%s %s: a status write of no object: %+v", method, target, req)
		}
		req.cacheable(r)
		req.scope(r) // an error is answered 400
		watchTimeout(r)
		describe(req, r)
		component(r.UserAgent())
		isUpgrade(r)
	})
}
