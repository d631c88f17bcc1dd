package heartbeat

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/gateway/poolcheck"
	"github.com/tether-edge/tether/tunnel"
)

// FuzzParseLease parses arbitrary delegated Leases: what is accepted is
// the node's Lease in kube-node-lease with a renewTime, and parses again
// to the same Lease once encoded; what is refused is refused as a
// BadLease, never another error or a panic.
func FuzzParseLease(f *testing.F) {
	renew := metav1.NewMicroTime(time.Date(2025, 3, 1, 12, 0, 0, 123456000, time.UTC))
	for _, l := range []*coordinationv1.Lease{
		{TypeMeta: metav1.TypeMeta{Kind: "Lease", APIVersion: "coordination.k8s.io/v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Namespace: "kube-node-lease", ResourceVersion: "41", UID: "u",
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "edge-1", UID: "n"}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("edge-1"), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &renew}},
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-1"}, Spec: coordinationv1.LeaseSpec{RenewTime: &renew}},
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Namespace: "kube-node-lease"}},
		{TypeMeta: metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: "edge-1"}},
	} {
		b, err := json.Marshal(l)
		if err != nil {
			f.Fatal(err)
		}
		f.Add("edge-1", b)
	}
	f.Add("edge-1", []byte(`{"metadata":{"name":"edge-1"},"spec":{"renewTime":null}}`))
	f.Add("", []byte(`{"spec":{"renewTime":"2025-03-01T12:00:00.000000Z"}}`))
	f.Fuzz(func(t *testing.T, node string, lease []byte) {
		l, err := parseLease(tunnel.DelegateRequest{Node: node, Lease: lease})
		if err != nil {
			var r *poolcheck.Refusal
			if !errors.As(err, &r) || r.Code != tunnel.BadLease {
				t.Fatalf("refused with %v, not a BadLease", err)
			}
			return
		}
		if l.Name != node || l.Namespace != "kube-node-lease" || l.Spec.RenewTime == nil ||
			(l.Kind != "" && l.Kind != "Lease") || (l.APIVersion != "" && l.APIVersion != "coordination.k8s.io/v1") {
			t.Fatalf("accepted %s/%s (%s %s, renewTime %v) for node %q", l.Namespace, l.Name, l.APIVersion, l.Kind, l.Spec.RenewTime, node)
		}
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatalf("accepted Lease does not encode: %v", err)
		}
		again, err := parseLease(tunnel.DelegateRequest{Node: node, Lease: b})
		if err != nil {
			t.Fatalf("accepted Lease %s refused once encoded: %v", b, err)
		}
		b2, _ := json.Marshal(again)
		if !bytes.Equal(b, b2) {
			t.Fatalf("encoded and parsed again:\n%s\n%s", b, b2)
		}
	})
}
