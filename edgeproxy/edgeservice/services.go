package edgeservice

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edgeproxy/apiproxy"
	"github.com/tether-edge/tether/internal/edgeaccess"
	"github.com/tether-edge/tether/internal/kube"
)

// UserAgent is the component name of the Service informer's requests.
const UserAgent = "tether-edge-services"

// Client is the Service informer as an internal client of the apiserver
// proxy (apiproxy.Loopback): its reads are cached, so that the marked
// Services are known offline after a restart.
var Client = apiproxy.Internal{Name: UserAgent, Cached: true}

// Services is an informer of every Service, kept to what the index reads
// (the mark, type, ClusterIPs and ports), that says when one changed.
type Services struct {
	inf     cache.SharedIndexInformer
	changed chan struct{}
	running sync.WaitGroup
}

// NewServices builds the informer; client reaches the apiserver as the
// node (the Node authorizer lets a node list and watch Services).
func NewServices(client *kube.Client) *Services {
	inf := cache.NewSharedIndexInformer(kube.ListWatch(client.Services("")), &corev1.Service{}, 0, cache.Indexers{})
	_ = inf.SetTransform(trimService)
	s := &Services{inf: inf, changed: make(chan struct{}, 1)}
	poke := func(any) { s.poke() }
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    poke,
		UpdateFunc: func(_, n any) { s.poke() },
		DeleteFunc: poke,
	})
	return s
}

func (s *Services) poke() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Start runs the informer until ctx ends.
func (s *Services) Start(ctx context.Context) { s.running.Go(func() { s.inf.RunWithContext(ctx) }) }

// Shutdown waits for the informer to stop (after ctx of Start ended).
func (s *Services) Shutdown() { s.running.Wait() }

// HasSynced reports whether the informer has synced.
func (s *Services) HasSynced() bool { return s.inf.HasSynced() }

// Changed receives after a Service was added, changed or deleted; many
// changes may come as one.
func (s *Services) Changed() <-chan struct{} { return s.changed }

// List returns every Service known.
func (s *Services) List() []*corev1.Service {
	objs := s.inf.GetStore().List()
	out := make([]*corev1.Service, 0, len(objs))
	for _, o := range objs {
		if svc, ok := o.(*corev1.Service); ok {
			out = append(out, svc)
		}
	}
	return out
}

// trimService keeps what the index reads of a Service.
func trimService(obj any) (any, error) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return obj, nil
	}
	out := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name, UID: svc.UID, ResourceVersion: svc.ResourceVersion},
		Spec:       corev1.ServiceSpec{Type: svc.Spec.Type, ClusterIP: svc.Spec.ClusterIP, ClusterIPs: svc.Spec.ClusterIPs},
	}
	if v, ok := svc.Annotations[edgeaccess.Annotation]; ok {
		out.Annotations = map[string]string{edgeaccess.Annotation: v}
		for _, p := range svc.Spec.Ports {
			out.Spec.Ports = append(out.Spec.Ports, corev1.ServicePort{Name: p.Name, Port: p.Port, Protocol: p.Protocol})
		}
	}
	return out, nil
}
