package localapi

import (
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestParseRequest(t *testing.T) {
	pods := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	leases := schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	for _, tc := range []struct {
		method, url string
		want        Request
	}{
		{"GET", "/api/v1/namespaces/ns/pods/p", Request{Verb: VerbGet, IsResource: true, GVR: pods, Namespace: "ns", Name: "p"}},
		{"GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn", Request{Verb: VerbList, IsResource: true, GVR: pods}},
		{"GET", "/api/v1/pods?watch=true", Request{Verb: VerbWatch, IsResource: true, GVR: pods}},
		{"GET", "/api/v1/watch/namespaces/ns/pods/p", Request{Verb: VerbWatch, IsResource: true, GVR: pods, Namespace: "ns", Name: "p"}},
		{"PATCH", "/api/v1/namespaces/ns/pods/p/status", Request{Verb: VerbPatch, IsResource: true, GVR: pods, Namespace: "ns", Name: "p", Subresource: "status"}},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n",
			Request{Verb: VerbUpdate, IsResource: true, GVR: leases, Namespace: "kube-node-lease", Name: "n"}},
		{"DELETE", "/api/v1/namespaces/ns/pods", Request{Verb: VerbDeleteCollection, IsResource: true, GVR: pods, Namespace: "ns"}},
		{"POST", "/api/v1/namespaces/ns/pods/p/eviction", Request{Verb: VerbCreate, IsResource: true, GVR: pods, Namespace: "ns", Name: "p", Subresource: "eviction"}},
		{"GET", "/api/v1/namespaces/ns", Request{Verb: VerbGet, IsResource: true, GVR: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, Name: "ns"}},
		{"PUT", "/api/v1/namespaces/ns/status", Request{Verb: VerbUpdate, IsResource: true, GVR: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, Name: "ns", Subresource: "status"}},
		{"GET", "/apis/discovery.k8s.io/v1/endpointslices", Request{Verb: VerbList, IsResource: true, GVR: schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}}},
		{"GET", "/api", Request{Verb: VerbProxy}},
		{"GET", "/apis/apps/v1", Request{Verb: VerbProxy}},
		{"GET", "/version", Request{Verb: VerbProxy}},
		{"GET", "/readyz", Request{Verb: VerbProxy}},
	} {
		r := httptest.NewRequest(tc.method, tc.url, nil)
		if diff := cmp.Diff(tc.want, ParseRequest(r)); diff != "" {
			t.Errorf("%s %s (-want +got):\n%s", tc.method, tc.url, diff)
		}
	}
}
