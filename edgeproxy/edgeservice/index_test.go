package edgeservice

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/edgeaccess"
	"github.com/tether-edge/tether/tunnel"
)

// The index holds every ClusterIP of a marked Service at its marked
// ports, and nothing of an unmarked one.
func TestIndex(t *testing.T) {
	ix := testIndex()
	want := []netip.AddrPort{marked, netip.MustParseAddrPort("[fd00:96::10]:80")}
	if got := ix.Destinations(); !slices.Equal(got, want) {
		t.Errorf("Destinations = %v, want %v", got, want)
	}
	orders := tunnel.ServiceRequest{Namespace: "shop", Name: "orders", Port: 80}
	if r, ok := ix.Lookup(netip.MustParseAddrPort("[::ffff:10.96.0.10]:80")); !ok || r != orders {
		t.Errorf("Lookup(v4-mapped) = %v, %v", r, ok)
	}
	if _, ok := ix.Lookup(unmarked); ok {
		t.Error("an unmarked Service is in the index")
	}
	if ix.Set(nil) != true || len(ix.Destinations()) != 0 {
		t.Error("Set(nil) did not empty the index")
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "b", Annotations: map[string]string{edgeaccess.Annotation: "web"}},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.12", Ports: []corev1.ServicePort{{Name: "web", Port: 8080}, {Name: "admin", Port: 9000}}}}
	if !ix.Set([]*corev1.Service{svc}) || ix.Set([]*corev1.Service{svc}) {
		t.Error("Set reports changes wrongly")
	}
	if got := ix.Destinations(); !slices.Equal(got, []netip.AddrPort{netip.MustParseAddrPort("10.96.0.12:8080")}) {
		t.Errorf("Destinations = %v", got)
	}
}
