package apiproxy

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edgeproxy/filter"
)

// The kubelet's view of the Service default/kubernetes. The kubelet
// gives every pod KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT
// from the Service it lists and watches through the proxy, and
// in-cluster config dials them. With the pod listener on, the Service
// the kubelet gets (online and, since the cache holds what the client
// got, offline) has the node's pod listener addresses as its cluster IPs
// and the listener's port in place of 443, as OpenYurt's masterservice
// filter does. Only the kubelet's requests are filtered: kube-proxy and
// CoreDNS keep the real Service.

var servicesGVR = corev1.SchemeGroupVersion.WithResource("services")

// kubernetesService rewrites default/kubernetes; it is a filter of the
// topology filter's kind (Topology), with no state to sync or change.
type kubernetesService struct {
	ips  []string
	port int32
}

var _ Topology = (*kubernetesService)(nil)

// Apply rewrites obj if it is the Service default/kubernetes.
func (k *kubernetesService) Apply(obj any) bool {
	s, ok := obj.(*corev1.Service)
	if !ok || s.Namespace != "default" || s.Name != "kubernetes" {
		return false
	}
	s.Spec.ClusterIP = k.ips[0]
	s.Spec.ClusterIPs = append([]string(nil), k.ips...)
	for i := range s.Spec.Ports {
		if s.Spec.Ports[i].Port == 443 {
			s.Spec.Ports[i].Port = k.port
		}
	}
	return true
}

// WaitSynced: nothing to wait for.
func (k *kubernetesService) WaitSynced(context.Context, time.Duration) bool { return true }

// Subscribe: the rewrite never changes while the process runs.
func (k *kubernetesService) Subscribe() (<-chan filter.Change, func()) { return nil, func() {} }
