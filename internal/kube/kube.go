// Package kube is the narrow Kubernetes client of tether-edge: typed
// clients for the few resources the edge itself reads and writes, over a
// scheme that holds only their API groups.
//
// client-go's clientset (k8s.io/client-go/kubernetes) registers every
// built-in API group, more than fifty, in its scheme at start, and its
// informer factory, leader election and certificate manager all import
// it. In a process that idles on an edge node that is most of its
// memory: a program that only imports them is 14 MB resident where one
// that imports net/http is 5 MB, and tether-edge's binary carried 6.6 MB of
// API types it never decodes. The edge binary therefore uses this package;
// the gateway and tetherctl keep the clientset.
//
// Its typed clients (Typed) send the requests the clientset's do:
// protobuf unless the rest.Config names another content type, the same
// paths, options and errors.
package kube

import (
	"context"
	"fmt"
	"net/http"

	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

//lint:file-ignore SA1019 core/v1 Endpoints is deprecated but still served; the node pool shares it (poolstore.DefaultResources).

// Scheme holds the API groups the edge uses: core/v1, discovery/v1,
// coordination/v1 and certificates/v1.
var Scheme = runtime.NewScheme()

var (
	codecs         = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, discoveryv1.AddToScheme, coordinationv1.AddToScheme, certificatesv1.AddToScheme,
	} {
		utilruntime.Must(add(Scheme))
	}
	// ListOptions, GetOptions, ... as query parameters.
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
}

// Client reaches one apiserver with one set of credentials; its methods
// return typed clients that share its connections.
type Client struct {
	core, discovery, coordination, certificates rest.Interface
}

// NewForConfig returns a Client for cfg, as kubernetes.NewForConfig does
// for the clientset (one HTTP client for all groups, cfg's rate limits).
func NewForConfig(cfg *rest.Config) (*Client, error) {
	c := rest.CopyConfig(cfg)
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	hc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	var kc Client
	for _, g := range []struct {
		gv   schema.GroupVersion
		path string
		rc   *rest.Interface
	}{
		{corev1.SchemeGroupVersion, "/api", &kc.core},
		{discoveryv1.SchemeGroupVersion, "/apis", &kc.discovery},
		{coordinationv1.SchemeGroupVersion, "/apis", &kc.coordination},
		{certificatesv1.SchemeGroupVersion, "/apis", &kc.certificates},
	} {
		rc, err := restClient(c, hc, g.gv, g.path)
		if err != nil {
			return nil, err
		}
		*g.rc = rc
	}
	return &kc, nil
}

func restClient(cfg *rest.Config, hc *http.Client, gv schema.GroupVersion, path string) (*rest.RESTClient, error) {
	c := *cfg
	c.GroupVersion = &gv
	c.APIPath = path
	c.NegotiatedSerializer = codecs.WithoutConversion()
	rc, err := rest.RESTClientForConfigAndClient(&c, hc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", gv, err)
	}
	return rc, nil
}

// The typed clients, named by resource.
type (
	ConfigMaps                 = Typed[*corev1.ConfigMap, *corev1.ConfigMapList]
	Services                   = Typed[*corev1.Service, *corev1.ServiceList]
	Endpoints                  = Typed[*corev1.Endpoints, *corev1.EndpointsList]
	Nodes                      = Typed[*corev1.Node, *corev1.NodeList]
	Pods                       = Typed[*corev1.Pod, *corev1.PodList]
	EndpointSlices             = Typed[*discoveryv1.EndpointSlice, *discoveryv1.EndpointSliceList]
	Leases                     = Typed[*coordinationv1.Lease, *coordinationv1.LeaseList]
	CertificateSigningRequests = Typed[*certificatesv1.CertificateSigningRequest, *certificatesv1.CertificateSigningRequestList]
)

// ConfigMaps in namespace.
func (c *Client) ConfigMaps(namespace string) *ConfigMaps {
	return newTyped(c.core, "configmaps", namespace,
		func() *corev1.ConfigMap { return &corev1.ConfigMap{} }, func() *corev1.ConfigMapList { return &corev1.ConfigMapList{} })
}

// Services in namespace ("": all).
func (c *Client) Services(namespace string) *Services {
	return newTyped(c.core, "services", namespace,
		func() *corev1.Service { return &corev1.Service{} }, func() *corev1.ServiceList { return &corev1.ServiceList{} })
}

// Endpoints in namespace ("": all).
func (c *Client) Endpoints(namespace string) *Endpoints {
	return newTyped(c.core, "endpoints", namespace,
		func() *corev1.Endpoints { return &corev1.Endpoints{} }, func() *corev1.EndpointsList { return &corev1.EndpointsList{} })
}

// Nodes of the cluster.
func (c *Client) Nodes() *Nodes {
	return newTyped(c.core, "nodes", "",
		func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} })
}

// Pods in namespace ("": all).
func (c *Client) Pods(namespace string) *Pods {
	return newTyped(c.core, "pods", namespace,
		func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} })
}

// EndpointSlices in namespace ("": all).
func (c *Client) EndpointSlices(namespace string) *EndpointSlices {
	return newTyped(c.discovery, "endpointslices", namespace,
		func() *discoveryv1.EndpointSlice { return &discoveryv1.EndpointSlice{} },
		func() *discoveryv1.EndpointSliceList { return &discoveryv1.EndpointSliceList{} })
}

// Leases in namespace.
func (c *Client) Leases(namespace string) *Leases {
	return newTyped(c.coordination, "leases", namespace,
		func() *coordinationv1.Lease { return &coordinationv1.Lease{} },
		func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} })
}

// CertificateSigningRequests of the cluster.
func (c *Client) CertificateSigningRequests() *CertificateSigningRequests {
	return newTyped(c.certificates, "certificatesigningrequests", "",
		func() *certificatesv1.CertificateSigningRequest { return &certificatesv1.CertificateSigningRequest{} },
		func() *certificatesv1.CertificateSigningRequestList {
			return &certificatesv1.CertificateSigningRequestList{}
		})
}

// ListerWatcher is what ListWatch needs of a typed client.
type ListerWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// ListWatch is c as an informer's source
// (cache.NewSharedIndexInformer).
func ListWatch[L runtime.Object](c ListerWatcher[L]) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.List(ctx, o)
		},
		WatchFuncWithContext: c.Watch,
	}
}
