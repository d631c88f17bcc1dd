package edgeaccess

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func svc(mark *string, typ corev1.ServiceType, clusterIP string) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"},
		Spec: corev1.ServiceSpec{Type: typ, ClusterIP: clusterIP, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80}, {Name: "grpc", Port: 9090, Protocol: corev1.ProtocolTCP},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		}},
	}
	if mark != nil {
		s.Annotations = map[string]string{Annotation: *mark}
	}
	return s
}

func ptr(s string) *string { return &s }

func TestPorts(t *testing.T) {
	for _, tc := range []struct {
		name string
		svc  *corev1.Service
		want []int32
	}{
		{"true", svc(ptr("true"), "", "10.96.0.10"), []int32{80, 9090}},
		{"by name and number", svc(ptr("grpc, 80"), corev1.ServiceTypeClusterIP, "10.96.0.10"), []int32{80, 9090}},
		{"one", svc(ptr("http"), corev1.ServiceTypeNodePort, "10.96.0.10"), []int32{80}},
		{"udp never", svc(ptr("dns,53"), "", "10.96.0.10"), nil},
		{"unmarked", svc(nil, "", "10.96.0.10"), nil},
		{"other value", svc(ptr("yes"), "", "10.96.0.10"), nil},
		{"headless", svc(ptr("true"), "", corev1.ClusterIPNone), nil},
		{"external name", svc(ptr("true"), corev1.ServiceTypeExternalName, ""), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int32
			for _, p := range Ports(tc.svc) {
				got = append(got, p.Port)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Ports = %v, want %v", got, tc.want)
			}
			// Port agrees with Ports on every port number.
			for _, p := range []uint16{53, 80, 9090, 81} {
				_, why := Port(tc.svc, p)
				if ok := slices.Contains(tc.want, int32(p)); ok != (why == "") {
					t.Errorf("Port(%d) = %q, want ok=%v", p, why, ok)
				}
			}
		})
	}
}
