package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestKubernetesManifests applies packaging/kubernetes to a real
// kube-apiserver: the RBAC files for real (the namespace the others need),
// then every other manifest with a server-side dry run, which validates and
// admits each object without storing it. Then it asks the apiserver what
// the gateway's identities may do: the least RBAC, no more.
func TestKubernetesManifests(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Join(world.RepoRoot(), "packaging", "kubernetes")
	rbac := []string{filepath.Join(dir, "gateway-rbac.yaml"), filepath.Join(dir, "gateway-hosts-configmap-rbac.yaml"),
		filepath.Join(dir, "edge-rbac.yaml"), filepath.Join(dir, "pool-rbac.yaml"), filepath.Join(dir, "edge-bootstrap-rbac.yaml")}
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, rbac...); err != nil {
		t.Fatalf("apply RBAC: %v", err)
	}
	manifests, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(manifests) < 4 {
		t.Fatalf("manifests in %s: %q %v", dir, manifests, err)
	}
	for _, m := range manifests {
		if slices.Contains(rbac, m) {
			continue // stored above; a second create would be a conflict
		}
		if err := testenv.ApplyManifests(ctx, cp.Admin, true, m); err != nil {
			t.Errorf("server-side dry run: %v", err)
		}
	}
	checkGatewayRBAC(t, ctx, cp)
}

// checkGatewayRBAC asks the apiserver what the gateway's identities (its
// ServiceAccount, the user tether-gateway) may do once gateway-rbac.yaml
// and gateway-hosts-configmap-rbac.yaml (or the Helm chart with
// gateway.hostsConfigMap kube-system/tether-nodes) are applied: the least
// RBAC, no more.
func checkGatewayRBAC(t *testing.T, ctx context.Context, cp *testenv.ControlPlane) {
	t.Helper()
	for _, user := range []string{"system:serviceaccount:tether-system:tether-gateway", "tether-gateway"} {
		for _, c := range []struct {
			verb, resource, namespace, name string
			allowed                         bool
		}{
			{"watch", "nodes", "", "", true},
			{"patch", "nodes", "", "", true},
			{"delete", "nodes", "", "", false},
			{"get", "secrets", "tether-system", "", false},
			// --node-autonomy: the tolerations of edge nodes' pods, by
			// patch; no pod made, replaced or deleted.
			{"list", "pods", "", "", true},
			{"watch", "pods", "", "", true},
			{"patch", "pods", "", "", true},
			{"get", "pods", "", "", false},
			{"create", "pods", "", "", false},
			{"update", "pods", "", "", false},
			{"delete", "pods", "", "", false},
			// Delegated heartbeats: node Leases, after reading the pool's
			// election record (an informer: list and watch); the election
			// records, written for the edges (RBAC cannot name them: any
			// ConfigMap in tether-system, but no delete); nothing else in
			// tether-system, no ConfigMap list elsewhere.
			{"update", "leases", "kube-node-lease", "edge-1", true},
			{"delete", "leases", "kube-node-lease", "edge-1", false},
			{"get", "configmaps", "tether-system", "pool-shop", true},
			{"create", "configmaps", "tether-system", "", true},
			{"update", "configmaps", "tether-system", "pool-shop", true},
			{"update", "configmaps", "tether-system", "pool-shop-sync", true},
			{"delete", "configmaps", "tether-system", "pool-shop", false},
			{"list", "configmaps", "tether-system", "", true},
			{"watch", "configmaps", "tether-system", "", true},
			{"list", "configmaps", "kube-system", "", false},
			{"watch", "configmaps", "", "", false},
			// --hosts-configmap kube-system/tether-nodes, and nothing else.
			{"update", "configmaps", "kube-system", "tether-nodes", true},
			{"create", "configmaps", "kube-system", "", true},
			{"update", "configmaps", "kube-system", "coredns", false},
			{"create", "configmaps", "default", "", false},
		} {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user,
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: c.verb, Resource: c.resource,
					Group: groupOf(c.resource), Namespace: c.namespace, Name: c.name},
			}}
			if user != "tether-gateway" {
				sar.Spec.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:tether-system", "system:authenticated"}
			}
			if got, reason := review(t, ctx, cp, sar, c.allowed); got != c.allowed {
				t.Errorf("%s may %s %s %s/%s: %v, want %v (%s)", user, c.verb, c.resource, c.namespace, c.name, got, c.allowed, reason)
			}
		}
	}
}

// The edges, as any node: read-only access to the pool election's records
// in tether-system (ConfigMaps, which the gateway writes for them: no
// node may write any, or it could write every pool's) and to what they
// serve, nothing else.
func TestEdgeRBAC(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Join(world.RepoRoot(), "packaging", "kubernetes")
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, filepath.Join(dir, "edge-rbac.yaml"), filepath.Join(dir, "pool-rbac.yaml")); err != nil {
		t.Fatal(err)
	}
	checkEdgeRBAC(t, ctx, cp)
}

// checkEdgeRBAC asks the apiserver what a node may do once edge-rbac.yaml
// and pool-rbac.yaml (or the Helm chart) are applied.
func checkEdgeRBAC(t *testing.T, ctx context.Context, cp *testenv.ControlPlane) {
	t.Helper()
	for _, c := range []struct {
		verb, resource, namespace, name string
		allowed                         bool
	}{
		{"get", "configmaps", "tether-system", "pool-shop", true},
		{"watch", "configmaps", "tether-system", "", true},
		{"update", "configmaps", "tether-system", "pool-shop", false},
		{"update", "configmaps", "tether-system", "pool-shop-sync", false},
		{"create", "configmaps", "tether-system", "", false},
		{"delete", "configmaps", "tether-system", "pool-shop", false},
		{"update", "configmaps", "kube-system", "coredns", false},
		{"get", "secrets", "tether-system", "", false},
		{"watch", "endpointslices", "", "", true},
		{"update", "endpointslices", "default", "x", false},
		{"watch", "services", "", "", true},
		// What kube-proxy and coredns list and watch through tether-edge.
		{"watch", "servicecidrs", "", "", true},
		{"update", "servicecidrs", "", "kubernetes", false},
		{"list", "namespaces", "", "", true},
		{"delete", "namespaces", "", "default", false},
		{"list", "pods", "", "", false},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: "system:node:edge-1", Groups: []string{"system:nodes", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: c.verb, Resource: c.resource,
				Group: groupOf(c.resource), Namespace: c.namespace, Name: c.name},
		}}
		if got, reason := review(t, ctx, cp, sar, c.allowed); got != c.allowed {
			t.Errorf("a node may %s %s %s/%s: %v, want %v (%s)", c.verb, c.resource, c.namespace, c.name, got, c.allowed, reason)
		}
	}
}

// review asks the apiserver whether sar is allowed. The authorizer sees
// new RBAC objects through its informers a moment after they are stored,
// so an answer that should be "allowed" is asked again until it is.
func review(t *testing.T, ctx context.Context, cp *testenv.ControlPlane, sar *authorizationv1.SubjectAccessReview, want bool) (bool, string) {
	t.Helper()
	var res *authorizationv1.SubjectAccessReview
	ask := func() bool {
		var err error
		if res, err = cp.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return res.Status.Allowed
	}
	if want {
		testenv.EventuallyNoError(t, "the review allowed", func() error {
			if ask() {
				return nil
			}
			return fmt.Errorf("denied: %s", res.Status.Reason)
		})
	} else {
		ask()
	}
	return res.Status.Allowed, res.Status.Reason
}

func groupOf(resource string) string {
	if resource == "endpointslices" {
		return "discovery.k8s.io"
	}
	if resource == "servicecidrs" {
		return "networking.k8s.io"
	}
	if resource == "leases" {
		return "coordination.k8s.io"
	}
	if strings.HasPrefix(resource, "certificatesigningrequests") {
		return "certificates.k8s.io"
	}
	return ""
}

// With edge-bootstrap-rbac.yaml, a bootstrap token may ask for a node
// client certificate and have it approved, a node may have its renewals
// approved, and neither may do more.
func TestEdgeBootstrapRBAC(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, filepath.Join(world.RepoRoot(), "packaging", "kubernetes", "edge-bootstrap-rbac.yaml")); err != nil {
		t.Fatal(err)
	}
	checkEdgeBootstrapRBAC(t, ctx, cp)
}

// checkEdgeBootstrapRBAC asks the apiserver what bootstrap tokens and
// nodes may do with certificate requests once edge-bootstrap-rbac.yaml (or
// the Helm chart with edge.bootstrapRBAC) is applied.
func checkEdgeBootstrapRBAC(t *testing.T, ctx context.Context, cp *testenv.ControlPlane) {
	t.Helper()
	token := []string{"system:bootstrap:abcdef", "system:bootstrappers", "system:authenticated"}
	node := []string{"system:node:edge-1", "system:nodes", "system:authenticated"}
	for _, c := range []struct {
		who                               []string
		verb, resource, subresource, name string
		allowed                           bool
	}{
		{token, "create", "certificatesigningrequests", "", "", true},
		{token, "create", "certificatesigningrequests", "nodeclient", "", true},      // approved for a bootstrap token
		{token, "create", "certificatesigningrequests", "selfnodeclient", "", false}, // renewals: nodes only
		{token, "update", "certificatesigningrequests", "approval", "x", false},
		{token, "list", "secrets", "", "", false},
		{token, "get", "nodes", "", "", false},
		{node, "create", "certificatesigningrequests", "selfnodeclient", "", true},
		{node, "update", "certificatesigningrequests", "approval", "x", false},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: c.who[0], Groups: c.who[1:],
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: c.verb, Resource: c.resource, Subresource: c.subresource,
				Group: groupOf(c.resource), Name: c.name},
		}}
		if got, reason := review(t, ctx, cp, sar, c.allowed); got != c.allowed {
			t.Errorf("%s may %s %s/%s %s: %v, want %v (%s)", c.who[0], c.verb, c.resource, c.subresource, c.name, got, c.allowed, reason)
		}
	}
}
