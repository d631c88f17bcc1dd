package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// ApplyManifests applies every object of the multi-document YAML files
// (the same manifests that packaging/kubernetes ships) with cfg's identity,
// as `kubectl apply --server-side` does: an object that exists (the
// namespace two manifests share) is updated, not an error. With dryRun the
// apiserver validates and admits them without storing (server-side dry
// run).
func ApplyManifests(ctx context.Context, cfg *rest.Config, dryRun bool, paths ...string) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("discovery client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	opts := metav1.ApplyOptions{FieldManager: "tether-testenv", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read manifest: %w", err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var obj unstructured.Unstructured
			if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return fmt.Errorf("decode %s: %w", path, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			gvk := obj.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				return fmt.Errorf("%s: %s %s: %w", path, gvk.Kind, obj.GetName(), err)
			}
			var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if m.Scope.Name() == "namespace" {
				ns := obj.GetNamespace()
				if ns == "" {
					ns = "default"
				}
				ri = dyn.Resource(m.Resource).Namespace(ns)
			}
			if _, err := ri.Apply(ctx, obj.GetName(), &obj, opts); err != nil {
				return fmt.Errorf("%s: apply %s %s: %w", path, gvk.Kind, obj.GetName(), err)
			}
		}
	}
	return nil
}
