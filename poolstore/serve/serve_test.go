package serve

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/replica"
)

var (
	sliceRes   = replica.ResourceKey(discoveryv1.SchemeGroupVersion.WithResource("endpointslices"))
	serviceRes = replica.ResourceKey(corev1.SchemeGroupVersion.WithResource("services"))
)

const slicesPath = "/apis/discovery.k8s.io/v1/endpointslices"

// endpointSliceJSON is the JSON of an EndpointSlice of service svc as the
// EndpointSlice controller writes it, with an endpoint per address.
func endpointSliceJSON(ns, name string, rv uint64, svc string, addrs ...string) json.RawMessage {
	es := discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name, GenerateName: svc + "-",
			UID:               types.UID(fmt.Sprintf("uid-%s-%s", ns, name)),
			ResourceVersion:   strconv.FormatUint(rv, 10),
			Generation:        1,
			CreationTimestamp: metav1.NewTime(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)),
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svc,
				discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
			},
			Annotations: map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2025-01-02T03:04:05Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc,
				UID: types.UID("svc-" + svc), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP),
			Port: ptr.To[int32](8080)}},
	}
	for i, a := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{a},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(fmt.Sprintf("edge-%d", i)),
			Zone:       ptr.To("site-a"),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("%s-%d", svc, i), UID: types.UID(fmt.Sprintf("pod-%s-%d", svc, i))},
		})
	}
	b, err := json.Marshal(es)
	if err != nil {
		panic(err)
	}
	return b
}

// serviceJSON is the JSON of a ClusterIP Service.
func serviceJSON(ns, name string, rv uint64) json.RawMessage {
	b, err := json.Marshal(corev1.Service{
		TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: strconv.FormatUint(rv, 10),
			UID: types.UID("svc-" + name)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10",
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	})
	if err != nil {
		panic(err)
	}
	return b
}

// newLeaderStore is a store in its leader's term.
func newLeaderStore(t *testing.T) *replica.Store {
	t.Helper()
	s := open(t, filepath.Join(t.TempDir(), replica.FileName))
	mustNil(t, s.StartEpoch("edge-0/1"))
	return s
}

// servedStore is a leader store with EndpointSlices in two namespaces (listed
// at resourceVersion 100) and Services synced without objects.
func servedStore(t *testing.T) *replica.Store {
	t.Helper()
	s := newLeaderStore(t)
	mustNil(t, s.Replace(sliceRes, []json.RawMessage{
		endpointSliceJSON("default", "web-abc", 10, "web", "10.0.0.1", "10.0.0.2"),
		endpointSliceJSON("default", "db-xyz", 11, "db", "10.0.1.1"),
		endpointSliceJSON("kube-system", "kube-dns-q", 12, "kube-dns", "10.0.2.1", "10.0.2.2"),
	}, 100))
	mustNil(t, s.Replace(serviceRes, nil, 90))
	return s
}

// getAnswer serves one request with h and returns its answer.
func getAnswer(t *testing.T, h http.Handler, target string) (*http.Response, []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	resp := rec.Result()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// listAnswer is what a list answer is read into.
type listAnswer struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Metadata   struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Items []struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	} `json:"items"`
}

func (l listAnswer) names() []string {
	out := []string{}
	for _, it := range l.Items {
		out = append(out, it.Metadata.Namespace+"/"+it.Metadata.Name)
	}
	return out
}

func TestList(t *testing.T) {
	h := New(servedStore(t), Options{})
	for _, tc := range []struct {
		name, target string
		want         []string
	}{
		{"all namespaces", slicesPath, []string{"default/db-xyz", "default/web-abc", "kube-system/kube-dns-q"}},
		{"namespace", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", []string{"default/db-xyz", "default/web-abc"}},
		{"label selector", slicesPath + "?labelSelector=kubernetes.io%2Fservice-name%3Dweb", []string{"default/web-abc"}},
		{"label selector, kube-proxy's", slicesPath + "?labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name",
			[]string{"default/db-xyz", "default/web-abc", "kube-system/kube-dns-q"}},
		{"set selector", slicesPath + "?labelSelector=kubernetes.io%2Fservice-name+in+%28db%2Ckube-dns%29", []string{"default/db-xyz", "kube-system/kube-dns-q"}},
		{"name field", slicesPath + "?fieldSelector=metadata.name%3Dweb-abc", []string{"default/web-abc"}},
		{"namespace field", slicesPath + "?fieldSelector=metadata.namespace%21%3Ddefault", []string{"kube-system/kube-dns-q"}},
		{"nothing", "/apis/discovery.k8s.io/v1/namespaces/other/endpointslices", []string{}},
		{"resourceVersion 0 and limit", slicesPath + "?resourceVersion=0&limit=1", []string{"default/db-xyz", "default/web-abc", "kube-system/kube-dns-q"}},
		{"exact resourceVersion", slicesPath + "?resourceVersion=100&resourceVersionMatch=Exact", []string{"default/db-xyz", "default/web-abc", "kube-system/kube-dns-q"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := getAnswer(t, h, tc.target)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("%s: %s %s", resp.Status, resp.Header.Get("Content-Type"), body)
			}
			if resp.ContentLength != int64(len(body)) {
				t.Errorf("Content-Length %d, body %d bytes", resp.ContentLength, len(body))
			}
			var l listAnswer
			mustNil(t, json.Unmarshal(body, &l))
			if l.Kind != "EndpointSliceList" || l.APIVersion != "discovery.k8s.io/v1" || l.Metadata.ResourceVersion != "100" {
				t.Errorf("list %s %s at %q", l.Kind, l.APIVersion, l.Metadata.ResourceVersion)
			}
			if d := cmp.Diff(tc.want, l.names()); d != "" {
				t.Errorf("items (-want +got):\n%s", d)
			}
		})
	}
	t.Run("empty, kind from the resource", func(t *testing.T) {
		resp, body := getAnswer(t, h, "/api/v1/services")
		var l listAnswer
		mustNil(t, json.Unmarshal(body, &l))
		if resp.StatusCode != http.StatusOK || l.Kind != "ServiceList" || l.APIVersion != "v1" || l.Metadata.ResourceVersion != "90" || len(l.Items) != 0 {
			t.Fatalf("%s: %s", resp.Status, body)
		}
	})
}

func TestGet(t *testing.T) {
	h := New(servedStore(t), Options{})
	resp, body := getAnswer(t, h, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/web-abc")
	var es discoveryv1.EndpointSlice
	mustNil(t, json.Unmarshal(body, &es))
	if resp.StatusCode != http.StatusOK || es.Name != "web-abc" || len(es.Endpoints) != 2 {
		t.Fatalf("%s: %s", resp.Status, body)
	}
	resp, body = getAnswer(t, h, "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices/web-abc")
	if st := readAPIStatus(t, body); resp.StatusCode != http.StatusNotFound || st.Reason != metav1.StatusReasonNotFound ||
		st.Message != `endpointslices.discovery.k8s.io "web-abc" not found` {
		t.Fatalf("%s: %s", resp.Status, body)
	}
}

func readAPIStatus(t *testing.T, body []byte) metav1.Status {
	t.Helper()
	var st metav1.Status
	if err := json.Unmarshal(body, &st); err != nil || st.Kind != "Status" || st.APIVersion != "v1" {
		t.Fatalf("not a Status (%v): %s", err, body)
	}
	return st
}

// TestRefusals: what the replica does not serve is answered as
// kube-apiserver answers it, with a Status.
func TestRefusals(t *testing.T) {
	h := New(servedStore(t), Options{FreshnessWait: 50 * time.Millisecond})
	for _, tc := range []struct {
		name, method, target string
		code                 int
		reason               metav1.StatusReason
	}{
		{"resource not in the replica", "GET", "/api/v1/endpoints", 503, metav1.StatusReasonServiceUnavailable},
		{"watch of a resource not in the replica", "GET", "/api/v1/pods?watch=true", 503, metav1.StatusReasonServiceUnavailable},
		{"write", "POST", "/api/v1/namespaces/default/services", 405, metav1.StatusReasonMethodNotAllowed},
		{"field not supported", "GET", slicesPath + "?fieldSelector=addressType%3DIPv4", 400, metav1.StatusReasonBadRequest},
		{"bad label selector", "GET", slicesPath + "?labelSelector=%3D%3D%3D", 400, metav1.StatusReasonBadRequest},
		{"bad resourceVersion", "GET", slicesPath + "?resourceVersion=abc", 400, metav1.StatusReasonBadRequest},
		{"continue", "GET", slicesPath + "?limit=1&continue=abc", 400, metav1.StatusReasonBadRequest},
		{"sendInitialEvents without NotOlderThan", "GET", slicesPath + "?watch=1&sendInitialEvents=true", 422, metav1.StatusReasonInvalid},
		{"subresource", "GET", "/api/v1/namespaces/default/services/web/status", 404, metav1.StatusReasonNotFound},
		{"discovery", "GET", "/apis", 404, metav1.StatusReasonNotFound},
		{"exact resourceVersion no longer held", "GET", slicesPath + "?resourceVersion=99&resourceVersionMatch=Exact", 410, metav1.StatusReasonExpired},
		{"resourceVersion not reached", "GET", slicesPath + "?resourceVersion=101", 504, metav1.StatusReasonTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.target, nil))
			st := readAPIStatus(t, rec.Body.Bytes())
			if rec.Code != tc.code || st.Code != int32(tc.code) || st.Reason != tc.reason {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
			if tc.code == 504 && (st.Details == nil || len(st.Details.Causes) != 1 || st.Details.Causes[0].Type != metav1.CauseTypeResourceVersionTooLarge) {
				t.Fatalf("too large resourceVersion without its cause: %s", rec.Body)
			}
		})
	}
}

// TestListWaitsForResourceVersion: a list at a resourceVersion the
// replica has not reached yet is answered once it has. The replica
// reaches it once the list waits (its timer is set on the handler's
// clock, which never fires).
func TestListWaitsForResourceVersion(t *testing.T) {
	s := servedStore(t)
	clk := testingclock.NewFakeClock(time.Now())
	h := New(s, Options{FreshnessWait: time.Minute, Clock: clk})
	type answer struct {
		resp *http.Response
		body []byte
	}
	answered := make(chan answer, 1)
	go func() {
		resp, body := getAnswer(t, h, slicesPath+"?resourceVersion=101&resourceVersionMatch=NotOlderThan")
		answered <- answer{resp, body}
	}()
	testenv.Eventually(t, "the list waits for 101", clk.HasWaiters)
	s.Apply(sliceRes, replica.Added, endpointSliceJSON("default", "late", 101, "late", "10.0.3.1"))
	a := <-answered
	resp, body := a.resp, a.body
	var l listAnswer
	mustNil(t, json.Unmarshal(body, &l))
	if resp.StatusCode != http.StatusOK || l.Metadata.ResourceVersion != "101" || len(l.Items) != 4 {
		t.Fatalf("%s: %s", resp.Status, body)
	}
}

func TestServes(t *testing.T) {
	h := New(servedStore(t), Options{})
	if !h.Serves(sliceRes) || !h.Serves(serviceRes) || h.Serves("core/v1/endpoints") {
		t.Fatal("Serves does not follow the replica's resources")
	}
}
