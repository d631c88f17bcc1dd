package kube

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// Object is what a Typed client handles: an API object with metadata.
type Object interface {
	runtime.Object
	metav1.Object
}

// Typed is the client of one resource, with the requests client-go's
// generated typed clients send (their gentype package, which also carries
// the fake clients and their dependencies into a binary). Protobuf is
// asked for unless the rest.Config names a content type.
type Typed[T Object, L runtime.Object] struct {
	client    rest.Interface
	resource  string
	namespace string // "": cluster-scoped, or all namespaces
	newObject func() T
	newList   func() L
}

func newTyped[T Object, L runtime.Object](client rest.Interface, resource, namespace string, newObject func() T, newList func() L) *Typed[T, L] {
	return &Typed[T, L]{client: client, resource: resource, namespace: namespace, newObject: newObject, newList: newList}
}

func (c *Typed[T, L]) request(r *rest.Request) *rest.Request {
	return r.UseProtobufAsDefaultIfPreferred(true).NamespaceIfScoped(c.namespace, c.namespace != "").Resource(c.resource)
}

// Get reads the object name.
func (c *Typed[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	obj := c.newObject()
	err := c.request(c.client.Get()).Name(name).VersionedParams(&opts, parameterCodec).Do(ctx).Into(obj)
	return obj, err
}

// List lists the objects opts selects.
func (c *Typed[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	list := c.newList()
	err := c.request(c.client.Get()).VersionedParams(&opts, parameterCodec).Timeout(timeout(opts)).Do(ctx).Into(list)
	return list, err
}

// Watch watches the objects opts selects.
func (c *Typed[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.request(c.client.Get()).VersionedParams(&opts, parameterCodec).Timeout(timeout(opts)).Watch(ctx)
}

// Create creates obj and returns it as the apiserver stored it.
func (c *Typed[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	out := c.newObject()
	err := c.request(c.client.Post()).VersionedParams(&opts, parameterCodec).Body(obj).Do(ctx).Into(out)
	return out, err
}

// Update replaces obj (its resourceVersion makes it conditional).
func (c *Typed[T, L]) Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	out := c.newObject()
	err := c.request(c.client.Put()).Name(obj.GetName()).VersionedParams(&opts, parameterCodec).Body(obj).Do(ctx).Into(out)
	return out, err
}

// UpdateStatus replaces obj's status subresource.
func (c *Typed[T, L]) UpdateStatus(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	out := c.newObject()
	err := c.request(c.client.Put()).Name(obj.GetName()).SubResource("status").VersionedParams(&opts, parameterCodec).Body(obj).Do(ctx).Into(out)
	return out, err
}

// Patch patches the object name.
func (c *Typed[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error) {
	out := c.newObject()
	err := c.request(c.client.Patch(pt)).Name(name).SubResource(subresources...).VersionedParams(&opts, parameterCodec).Body(data).Do(ctx).Into(out)
	return out, err
}

// Delete deletes the object name.
func (c *Typed[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return c.request(c.client.Delete()).Name(name).Body(&opts).Do(ctx).Error()
}

func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}
