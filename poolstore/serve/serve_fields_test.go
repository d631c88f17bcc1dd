package serve

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tether-edge/tether/poolstore/replica"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const servicesPath = "/api/v1/services"

// serviceOfType is the JSON of a Service with that type and clusterIP
// ("" for none, "None" for a headless Service).
func serviceOfType(ns, name string, rv uint64, typ corev1.ServiceType, clusterIP string) json.RawMessage {
	b, err := json.Marshal(corev1.Service{
		TypeMeta:   metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: strconv.FormatUint(rv, 10)},
		Spec:       corev1.ServiceSpec{Type: typ, ClusterIP: clusterIP},
	})
	if err != nil {
		panic(err)
	}
	return b
}

// servicesStore holds a ClusterIP, a headless, a NodePort and an
// ExternalName Service (listed at resourceVersion 50).
func servicesStore(t *testing.T) *replica.Store {
	t.Helper()
	s := newLeaderStore(t)
	mustNil(t, s.Replace(serviceRes, []json.RawMessage{
		serviceJSON("default", "web", 10),
		serviceOfType("default", "headless", 11, corev1.ServiceTypeClusterIP, corev1.ClusterIPNone),
		serviceOfType("default", "node-port", 12, corev1.ServiceTypeNodePort, "10.96.0.12"),
		serviceOfType("kube-system", "external", 13, corev1.ServiceTypeExternalName, ""),
	}, 50))
	return s
}

// TestServiceFieldSelectors: Services are selected by spec.clusterIP and
// spec.type as kube-apiserver selects them; kube-proxy lists and watches
// them with spec.clusterIP!=None.
func TestServiceFieldSelectors(t *testing.T) {
	h := New(servicesStore(t), Options{})
	for _, tc := range []struct {
		name, selector string
		want           []string
	}{
		{"kube-proxy's", "spec.clusterIP%21%3DNone", []string{"default/node-port", "default/web", "kube-system/external"}},
		{"headless only", "spec.clusterIP%3DNone", []string{"default/headless"}},
		{"no clusterIP", "spec.clusterIP%3D", []string{"kube-system/external"}},
		{"type", "spec.type%3DNodePort", []string{"default/node-port"}},
		{"type and namespace", "spec.type%21%3DNodePort%2Cmetadata.namespace%3Ddefault", []string{"default/headless", "default/web"}},
		{"and name", "spec.clusterIP%21%3DNone%2Cmetadata.name%3Dweb", []string{"default/web"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := getAnswer(t, h, servicesPath+"?fieldSelector="+tc.selector)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %s", resp.Status, body)
			}
			var l listAnswer
			mustNil(t, json.Unmarshal(body, &l))
			if d := cmp.Diff(tc.want, l.names()); d != "" {
				t.Errorf("items (-want +got):\n%s", d)
			}
		})
	}
	// Only Services have these fields; unknown fields stay refused.
	for _, target := range []string{slicesPath + "?fieldSelector=spec.clusterIP%21%3DNone", servicesPath + "?fieldSelector=spec.ports%3D80"} {
		resp, body := getAnswer(t, h, target)
		if st := readAPIStatus(t, body); resp.StatusCode != http.StatusBadRequest || st.Reason != metav1.StatusReasonBadRequest {
			t.Errorf("%s: %s %s", target, resp.Status, body)
		}
	}
}

// TestWatchServiceFieldSelector: a Service that starts or stops matching
// kube-proxy's field selector (its clusterIP or type changed) is sent as
// ADDED or DELETED, as for a label selector.
func TestWatchServiceFieldSelector(t *testing.T) {
	s := servicesStore(t)
	h := New(s, Options{})
	w := openWatch(t, h, servicesPath+"?watch=1&fieldSelector=spec.clusterIP%21%3DNone")
	diffEvents(t, "initial", []string{"ADDED default/node-port 12", "ADDED default/web 10", "ADDED kube-system/external 13"}, w.nextN(3))

	mustNil(t, s.Apply(serviceRes, replica.Modified, serviceOfType("kube-system", "external", 51, corev1.ServiceTypeClusterIP, corev1.ClusterIPNone)))
	mustNil(t, s.Apply(serviceRes, replica.Modified, serviceOfType("default", "headless", 52, corev1.ServiceTypeClusterIP, corev1.ClusterIPNone)))
	mustNil(t, s.Apply(serviceRes, replica.Modified, serviceOfType("default", "web", 53, corev1.ServiceTypeNodePort, "10.96.0.10")))
	mustNil(t, s.Apply(serviceRes, replica.Added, serviceOfType("default", "new", 54, corev1.ServiceTypeClusterIP, "10.96.0.54")))
	diffEvents(t, "changes", []string{
		"DELETED kube-system/external 51",
		"MODIFIED default/web 53",
		"ADDED default/new 54",
	}, w.nextN(3))
}
