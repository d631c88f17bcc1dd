// Package pooltest starts what the tests of the gateway's pool requests
// (delegated heartbeats, election records) share: a real kube-apiserver
// with the gateway's RBAC (packaging/kubernetes/gateway-rbac.yaml), Nodes
// in pools, a client with the gateway's identity, and poolstore's real
// election. It is test support only; no production package imports it.
package pooltest

import (
	"context"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/elect"
	"github.com/tether-edge/tether/poolstore/record"
)

// Options configure Start.
type Options struct {
	// Manifests are more files of packaging/kubernetes to apply after
	// gateway-rbac.yaml ("edge-rbac.yaml").
	Manifests []string
	// Pools are the Nodes to create: name → pool ("" for a Node without
	// the pool label).
	Pools map[string]string
	// Labels are put on every Node, besides the pool label.
	Labels map[string]string
}

// Cluster is a started control plane with the gateway's RBAC and Nodes.
type Cluster struct {
	*testenv.ControlPlane
	// Ctx bounds the test: two minutes, canceled at its cleanup.
	Ctx context.Context
	// GatewayCert is user tether-gateway's client certificate, and
	// Gateway a client with it.
	GatewayCert *testenv.KeyPair
	Gateway     kubernetes.Interface

	t testing.TB
}

// Start starts a control plane, applies the manifests, waits until the
// gateway's identity may read the ConfigMaps of tether-system, and
// creates the Nodes.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	paths := []string{manifest("gateway-rbac.yaml")}
	for _, m := range o.Manifests {
		paths = append(paths, manifest(m))
	}
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, paths...); err != nil {
		t.Fatal(err)
	}
	kp, err := cp.CA.ClientCert("tether-gateway")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := kubernetes.NewForConfig(cp.RESTConfig(kp))
	if err != nil {
		t.Fatal(err)
	}
	// The gateway's RBAC is seen by the authorizer a moment after it is
	// stored.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := gw.CoreV1().ConfigMaps(record.Namespace).Get(ctx, "none", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway cannot read tether-system's ConfigMaps: %v", err)
		}
	}
	for node, pool := range o.Pools {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{}}}
		for k, v := range o.Labels {
			n.Labels[k] = v
		}
		if pool != "" {
			n.Labels[openyurt.PoolLabel] = pool
		}
		if _, err := cp.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return &Cluster{ControlPlane: cp, Ctx: ctx, GatewayCert: kp, Gateway: gw, t: t}
}

// manifest is the path of a file of packaging/kubernetes.
func manifest(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "packaging", "kubernetes", name)
}

// Elect runs poolstore's election for pool with node as the only
// candidate (with the admin's identity) and waits until the record names
// node. The election runs until stop (which returns once the elector has
// stopped and released the record) or the test's cleanup.
func (c *Cluster) Elect(pool, node string) (stop func()) {
	c.t.Helper()
	client, err := kube.NewForConfig(c.Admin)
	if err != nil {
		c.t.Fatal(err)
	}
	e, err := elect.New(elect.Options{Client: client, Pool: pool, Node: node})
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(c.Ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Run(ctx, func(ctx context.Context) { <-ctx.Done() })
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	c.t.Cleanup(stop)
	poll(c.t, node+" leads "+pool, func() bool {
		el, err := record.ReadLeader(c.Ctx, c.Client.CoreV1().ConfigMaps(record.Namespace), pool)
		return err == nil && el.Holder == node
	})
	return stop
}

// poll waits up to ten seconds for cond.
func poll(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}
