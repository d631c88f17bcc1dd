package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/e2e/benchkit"
)

// The first endpoint's address of slice i in round r (0 when created) is
// 10.r.<i/250>.<i%250+1>: the marker by which a watcher knows it has seen
// round r's change of that slice.
const (
	maxRounds       = 200
	maxSlices       = 250 * 256
	endpointsPerEPS = 5
)

func sliceName(i int) string { return fmt.Sprintf("svc-%d", i) }

// marker is the first endpoint's address of slice i in round r.
func marker(r, i int) string { return fmt.Sprintf("10.%d.%d.%d", r, i/250, i%250+1) }

// createSlices creates namespace bench and n EndpointSlices in it, each
// with five ready endpoints on the site's nodes and one port, about the
// size of a small Service's slice.
func createSlices(ctx context.Context, c kubernetes.Interface, n int) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}}
	if _, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", benchNS, err)
	}
	return benchkit.Parallel(ctx, 8, n, func(i int) error {
		es := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: sliceName(i), Namespace: benchNS,
				Labels: map[string]string{discoveryv1.LabelServiceName: sliceName(i), discoveryv1.LabelManagedBy: "poolbench"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		}
		for j := range endpointsPerEPS {
			addr := fmt.Sprintf("10.%d.%d.%d", 200+j, i/250, i%250+1)
			if j == 0 {
				addr = marker(0, i)
			}
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{addr},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
				NodeName:   ptr.To(fmt.Sprintf("edge-%d", (i+j)%10+1)),
			})
		}
		if _, err := c.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create EndpointSlice %s: %w", es.Name, err)
		}
		return nil
	})
}

// changeAll sets the first endpoint address of every slice to round r's
// marker, with workers concurrent writers, and returns when each update
// returned.
func changeAll(ctx context.Context, c kubernetes.Interface, n, r, workers int) ([]time.Time, error) {
	list, err := c.DiscoveryV1().EndpointSlices(benchNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list EndpointSlices: %w", err)
	}
	current := make(map[string]*discoveryv1.EndpointSlice, len(list.Items))
	for k := range list.Items {
		current[list.Items[k].Name] = &list.Items[k]
	}
	returned := make([]time.Time, n)
	err = benchkit.Parallel(ctx, workers, n, func(i int) error {
		es := current[sliceName(i)]
		for attempt := 0; ; attempt++ {
			if es == nil || len(es.Endpoints) == 0 {
				return fmt.Errorf("EndpointSlice %s: missing or without endpoints", sliceName(i))
			}
			es = es.DeepCopy()
			es.Endpoints[0].Addresses = []string{marker(r, i)}
			_, err := c.DiscoveryV1().EndpointSlices(benchNS).Update(ctx, es, metav1.UpdateOptions{})
			if err == nil {
				returned[i] = time.Now()
				return nil
			}
			if !apierrors.IsConflict(err) || attempt == 3 {
				return fmt.Errorf("update EndpointSlice %s: %w", es.Name, err)
			}
			if es, err = c.DiscoveryV1().EndpointSlices(benchNS).Get(ctx, es.Name, metav1.GetOptions{}); err != nil {
				return fmt.Errorf("get EndpointSlice %s: %w", sliceName(i), err)
			}
		}
	})
	return returned, err
}
