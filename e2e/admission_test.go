package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/gateway/dnat"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/testenv"
)

// nodePolicy is the name of the ValidatingAdmissionPolicy (and of its
// binding) in packaging/kubernetes/node-admission.yaml; the apiserver
// names it in every refusal.
const nodePolicy = "tether-node-restriction"

// TestNodeAdmission applies packaging/kubernetes/node-admission.yaml to a
// real kube-apiserver and shows, with node client certificates, that a node
// can no longer add, change or remove the pool label, the edge label or the
// tether.io/vip annotation of its own Node, by any verb and through
// nodes/status too, while it keeps doing what a kubelet does; that the
// operator and the gateway still set them; that registration may carry the
// edge label but neither the pool label nor the annotation; and that a node
// cannot delete its Node to register again, even where RBAC would let it.
func TestNodeAdmission(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := filepath.Join(world.RepoRoot(), "packaging", "kubernetes")

	// edge-1 holds every protected key, edge-2 none of them; both have a
	// label and an annotation of their own, as real Nodes do.
	protected := map[string]string{nodewatch.PoolLabel: "shop", nodewatch.EdgeLabel: "true"}
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-1",
			Labels:      map[string]string{"kubernetes.io/hostname": "edge-1", nodewatch.PoolLabel: "shop", nodewatch.EdgeLabel: "true"},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", nodewatch.VIPAnnotation: "100.64.0.1"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-2",
			Labels:      map[string]string{"kubernetes.io/hostname": "edge-2"},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-3", Labels: map[string]string{"kubernetes.io/hostname": "edge-3"}}},
	} {
		if _, err := cp.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, filepath.Join(dir, "node-admission.yaml")); err != nil {
		t.Fatal(err)
	}
	edge1, _, _ := cp.NodeClient(t, "edge-1")
	edge2, _, _ := cp.NodeClient(t, "edge-2")

	// The apiserver enforces the policy once its informers have it and it
	// is compiled: until a dry-run change by edge-1 is refused.
	untilRefusedByPolicy(t, ctx, "a change of edge-1's pool label", func(dryRun []string) error {
		_, err := edge1.CoreV1().Nodes().Patch(ctx, "edge-1", types.MergePatchType,
			labelPatch(nodewatch.PoolLabel, "bank"), metav1.PatchOptions{DryRun: dryRun})
		return err
	})

	t.Run("TypeChecks", func(t *testing.T) {
		// kube-controller-manager type-checks the expressions against
		// the Node schema and writes warnings (a misspelt field, a wrong
		// type) into the policy's status.
		cp.StartControllerManager(t, testenv.ControllerManagerOptions{
			Controllers: []string{"validatingadmissionpolicy-status-controller"}})
		vap := waitPolicyChecked(t, ctx, cp.Client)
		if vap.Status.TypeChecking == nil || len(vap.Status.TypeChecking.ExpressionWarnings) > 0 {
			t.Errorf("type checking of %s: %+v", nodePolicy, vap.Status.TypeChecking)
		}
	})

	t.Run("KubeletKeepsWorking", func(t *testing.T) {
		nodes := edge1.CoreV1().Nodes()
		// Status as the kubelet reports it: a strategic merge patch of
		// nodes/status, then a whole-object status update.
		status := `{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady",` +
			`"lastHeartbeatTime":"2026-01-01T00:00:00Z","lastTransitionTime":"2026-01-01T00:00:00Z"}],` +
			`"addresses":[{"type":"InternalIP","address":"192.168.1.10"},{"type":"Hostname","address":"edge-1"}]}}`
		if _, err := nodes.PatchStatus(ctx, "edge-1", []byte(status)); err != nil {
			t.Fatalf("status patch: %v", err)
		}
		n, err := nodes.Get(ctx, "edge-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Capacity = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")}
		if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("status update: %v", err)
		}
		// Its other labels and annotations, by every verb.
		if _, err := nodes.Patch(ctx, "edge-1", types.MergePatchType, labelPatch("example.com/rack", "r1"), metav1.PatchOptions{}); err != nil {
			t.Errorf("merge patch of an unrelated label: %v", err)
		}
		if _, err := nodes.Patch(ctx, "edge-1", types.JSONPatchType, jsonPatch("add", "annotations", "example.com/note", "n"), metav1.PatchOptions{}); err != nil {
			t.Errorf("JSON patch of an unrelated annotation: %v", err)
		}
		if _, err := nodes.Patch(ctx, "edge-1", types.ApplyPatchType, applyPatch("edge-1", "labels", "example.com/applied", "yes"),
			metav1.PatchOptions{FieldManager: "kubelet", Force: ptr.To(true)}); err != nil {
			t.Errorf("server-side apply of an unrelated label: %v", err)
		}
		n, err = nodes.Get(ctx, "edge-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels["example.com/rack"] = "r2"
		delete(n.Annotations, "example.com/note")
		if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Errorf("update of unrelated keys: %v", err)
		}
		// A protected key set to the value it has is no change.
		if _, err := nodes.Patch(ctx, "edge-1", types.MergePatchType, labelPatch(nodewatch.PoolLabel, "shop"), metav1.PatchOptions{}); err != nil {
			t.Errorf("merge patch of the pool label to its own value: %v", err)
		}
		n, err = cp.Client.CoreV1().Nodes().Get(ctx, "edge-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(n.Status.Addresses) != 2 || n.Status.Capacity.Pods().Value() != 110 ||
			n.Labels["example.com/rack"] != "r2" || n.Labels["example.com/applied"] != "yes" {
			t.Errorf("edge-1 after its own writes: labels %v, status %+v", n.Labels, n.Status)
		}
	})

	t.Run("ProtectedKeys", func(t *testing.T) {
		keys := []struct{ field, key, value string }{
			{"labels", nodewatch.PoolLabel, "bank"},
			{"labels", nodewatch.EdgeLabel, "false"},
			{"annotations", nodewatch.VIPAnnotation, "100.64.0.2"},
		}
		changes := []struct {
			name   string
			client kubernetes.Interface
			node   string // edge-1 holds every key, edge-2 none
			remove bool
		}{
			{"add", edge2, "edge-2", false},
			{"change", edge1, "edge-1", false},
			{"remove", edge1, "edge-1", true},
		}
		for _, k := range keys {
			for _, c := range changes {
				for _, sub := range []string{"", "status"} {
					for _, verb := range []string{"update", "merge patch", "strategic merge patch", "JSON patch", "apply"} {
						if verb == "apply" && c.remove {
							// Apply removes only what its field manager
							// alone owns, and the operator set the key.
							continue
						}
						name := fmt.Sprintf("%s %s by %s of nodes", c.name, k.key, verb)
						if sub != "" {
							name += "/" + sub
						}
						t.Run(name, func(t *testing.T) {
							value := k.value
							if c.remove {
								value = ""
							}
							err := changeKey(ctx, c.client, c.node, sub, verb, k.field, k.key, value)
							wantRefusal(t, err, k.key)
						})
					}
				}
			}
		}
		// Nothing of it reached the Nodes.
		for _, c := range []struct {
			node                string
			labels, annotations map[string]string
		}{
			{"edge-1", protected, map[string]string{nodewatch.VIPAnnotation: "100.64.0.1"}},
			{"edge-2", nil, nil},
		} {
			n, err := cp.Client.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := pick(n.Labels, nodewatch.PoolLabel, nodewatch.EdgeLabel); !maps.Equal(got, c.labels) {
				t.Errorf("%s's protected labels: %v, want %v", c.node, got, c.labels)
			}
			if got := pick(n.Annotations, nodewatch.VIPAnnotation); !maps.Equal(got, c.annotations) {
				t.Errorf("%s's protected annotations: %v, want %v", c.node, got, c.annotations)
			}
		}
	})

	t.Run("OperatorAndGatewaySetThem", func(t *testing.T) {
		nodes := cp.Client.CoreV1().Nodes()
		if _, err := nodes.Patch(ctx, "edge-3", types.MergePatchType, labelPatch(nodewatch.PoolLabel, "shop"), metav1.PatchOptions{}); err != nil {
			t.Errorf("the operator adds a pool label: %v", err)
		}
		if _, err := nodes.Patch(ctx, "edge-3", types.JSONPatchType, jsonPatch("add", "labels", nodewatch.EdgeLabel, "true"), metav1.PatchOptions{}); err != nil {
			t.Errorf("the operator adds the edge label: %v", err)
		}
		if _, err := nodes.Patch(ctx, "edge-3", types.MergePatchType, labelPatch(nodewatch.PoolLabel, "bank"), metav1.PatchOptions{}); err != nil {
			t.Errorf("the operator moves a node to another pool: %v", err)
		}
		// The gateway records VIPs with its own identity and RBAC, with
		// the patch of vip mode.
		if err := testenv.ApplyManifests(ctx, cp.Admin, false, filepath.Join(dir, "gateway-rbac.yaml")); err != nil {
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
		patcher := dnat.APIPatcher{Client: gw}
		// RBAC reaches the authorizer through its informers a moment
		// after it is stored.
		untilAllowed(t, "the gateway's VIP record", func() error {
			return patcher.SetVIP(ctx, "edge-3", netip.MustParseAddr("100.64.0.3"))
		})
		n, err := nodes.Get(ctx, "edge-3", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{nodewatch.PoolLabel: "bank", nodewatch.EdgeLabel: "true"}
		if got := pick(n.Labels, nodewatch.PoolLabel, nodewatch.EdgeLabel); !maps.Equal(got, want) || n.Annotations[nodewatch.VIPAnnotation] != "100.64.0.3" {
			t.Errorf("edge-3: labels %v, annotations %v", n.Labels, n.Annotations)
		}
	})

	t.Run("AnotherNodesNode", func(t *testing.T) {
		// NodeRestriction, before the policy: edge-1 touches nothing of
		// edge-2's, not even an unrelated label or its status.
		_, err := edge1.CoreV1().Nodes().Patch(ctx, "edge-2", types.MergePatchType, labelPatch("example.com/rack", "r1"), metav1.PatchOptions{})
		wantForbidden(t, err, `not allowed to modify node "edge-2"`)
		_, err = edge1.CoreV1().Nodes().PatchStatus(ctx, "edge-2", []byte(`{"status":{"addresses":[{"type":"InternalIP","address":"192.168.1.10"}]}}`))
		wantForbidden(t, err, `not allowed to modify node "edge-2"`)
	})

	t.Run("Registration", func(t *testing.T) {
		// A node may register itself with the edge label, as an OpenYurt
		// join does with the kubelet's --node-labels, but not into a pool:
		// the operator puts it there. It can create its Node only while
		// none of that name exists.
		edge4, _, _ := cp.NodeClient(t, "edge-4")
		joined := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-4", Labels: maps.Clone(protected)}}
		_, err := edge4.CoreV1().Nodes().Create(ctx, joined, metav1.CreateOptions{})
		wantRefusal(t, err, nodewatch.PoolLabel)
		delete(joined.Labels, nodewatch.PoolLabel)
		if _, err := edge4.CoreV1().Nodes().Create(ctx, joined, metav1.CreateOptions{}); err != nil {
			t.Fatalf("registration with the edge label: %v", err)
		}
		// Registering again (a kubelet restart) does not replace them.
		joined.Labels[nodewatch.PoolLabel] = "bank"
		if _, err := edge4.CoreV1().Nodes().Create(ctx, joined, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) && !apierrors.IsForbidden(err) {
			t.Errorf("second registration: %v, want already exists or refused", err)
		}
		_, err = edge4.CoreV1().Nodes().Patch(ctx, "edge-4", types.ApplyPatchType, applyPatch("edge-4", "labels", nodewatch.PoolLabel, "bank"),
			metav1.PatchOptions{FieldManager: "kubelet", Force: ptr.To(true)})
		wantRefusal(t, err, nodewatch.PoolLabel)
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, "edge-4", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := pick(n.Labels, nodewatch.PoolLabel, nodewatch.EdgeLabel), map[string]string{nodewatch.EdgeLabel: "true"}; !maps.Equal(got, want) {
			t.Errorf("edge-4's labels after registering again: %v, want %v", got, want)
		}

		// No kubelet sets the VIP annotation: registration with it is
		// refused. Without it, the node registers and reports status.
		edge5, _, _ := cp.NodeClient(t, "edge-5")
		_, err = edge5.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-5",
			Annotations: map[string]string{nodewatch.VIPAnnotation: "100.64.0.1"}}}, metav1.CreateOptions{})
		wantRefusal(t, err, nodewatch.VIPAnnotation)
		if _, err := edge5.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-5"}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("registration without labels: %v", err)
		}
		if _, err := edge5.CoreV1().Nodes().PatchStatus(ctx, "edge-5", []byte(`{"status":{"addresses":[{"type":"InternalIP","address":"192.168.1.15"}]}}`)); err != nil {
			t.Errorf("status of a Node without labels or annotations: %v", err)
		}
		// And only its own name (NodeRestriction).
		_, err = edge1.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-6"}}, metav1.CreateOptions{})
		wantForbidden(t, err, `not allowed to modify node "edge-6"`)
	})

	t.Run("PodCIDRs", func(t *testing.T) {
		// A Node's pod ranges route its pods' traffic (issue 31): the
		// control plane (node IPAM) or the operator sets them, never the
		// node. Kubernetes lets a node set them when it registers and
		// while they are empty (NodeRestriction checks neither).
		edge7, _, _ := cp.NodeClient(t, "edge-7")
		_, err := edge7.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-7"},
			Spec: corev1.NodeSpec{PodCIDR: "10.244.7.0/24", PodCIDRs: []string{"10.244.7.0/24"}}}, metav1.CreateOptions{})
		wantRefusal(t, err, "podCIDRs")
		if _, err := edge7.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-7"}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("registration without pod ranges: %v", err)
		}
		// Empty, then set by the node: refused, by merge and by apply.
		_, err = edge7.CoreV1().Nodes().Patch(ctx, "edge-7", types.MergePatchType,
			[]byte(`{"spec":{"podCIDR":"10.244.8.0/24","podCIDRs":["10.244.8.0/24"]}}`), metav1.PatchOptions{})
		wantRefusal(t, err, "podCIDRs")
		// The operator (or node IPAM) sets them; the node keeps
		// reporting its status.
		if _, err := cp.Client.CoreV1().Nodes().Patch(ctx, "edge-7", types.MergePatchType,
			[]byte(`{"spec":{"podCIDR":"10.244.9.0/24","podCIDRs":["10.244.9.0/24"]}}`), metav1.PatchOptions{}); err != nil {
			t.Fatalf("the operator setting edge-7's pod ranges: %v", err)
		}
		if _, err := edge7.CoreV1().Nodes().PatchStatus(ctx, "edge-7", []byte(`{"status":{"addresses":[{"type":"InternalIP","address":"192.168.1.17"}]}}`)); err != nil {
			t.Errorf("status of a Node with pod ranges: %v", err)
		}
		if _, err := edge7.CoreV1().Nodes().Patch(ctx, "edge-7", types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"example.com/own":"yes"}}}`), metav1.PatchOptions{}); err != nil {
			t.Errorf("an unprotected label of a Node with pod ranges: %v", err)
		}
	})

	t.Run("Deletion", func(t *testing.T) {
		// Kubernetes' RBAC lets no node delete a Node (since 1.13)...
		err := edge1.CoreV1().Nodes().Delete(ctx, "edge-1", metav1.DeleteOptions{})
		wantForbidden(t, err, `cannot delete resource "nodes"`)
		// ...and where a cluster grants it, as some distributions do for
		// their shutdown scripts, the policy still refuses a node its own.
		rbac := cp.Client.RbacV1()
		if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "kubelet-delete"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"delete"}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "kubelet-delete"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kubelet-delete"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "Group", Name: "system:nodes"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		untilRefusedByPolicy(t, ctx, "edge-1 deleting its Node under the granted RBAC", func(dryRun []string) error {
			return edge1.CoreV1().Nodes().Delete(ctx, "edge-1", metav1.DeleteOptions{DryRun: dryRun})
		})
		err = edge1.CoreV1().Nodes().Delete(ctx, "edge-1", metav1.DeleteOptions{})
		wantRefusal(t, err, "delete its Node")
		if _, err := cp.Client.CoreV1().Nodes().Get(ctx, "edge-1", metav1.GetOptions{}); err != nil {
			t.Errorf("edge-1 after its delete: %v", err)
		}
	})
}

// changeKey sets key in the Node's field ("labels" or "annotations") to
// value, or removes it when value is "", with verb, through the
// subresource sub ("" or "status"). Every verb is one request, as an
// attacker with the node's key would send it.
func changeKey(ctx context.Context, c kubernetes.Interface, node, sub, verb, field, key, value string) error {
	nodes := c.CoreV1().Nodes()
	var subs []string
	if sub != "" {
		subs = []string{sub}
	}
	patch := func(pt types.PatchType, body []byte, opts metav1.PatchOptions) error {
		_, err := nodes.Patch(ctx, node, pt, body, opts, subs...)
		return err
	}
	switch verb {
	case "update":
		n, err := nodes.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get %s: %w", node, err)
		}
		m := &n.Labels
		if field == "annotations" {
			m = &n.Annotations
		}
		if *m == nil {
			*m = map[string]string{}
		}
		if value == "" {
			delete(*m, key)
		} else {
			(*m)[key] = value
		}
		if sub == "status" {
			_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		} else {
			_, err = nodes.Update(ctx, n, metav1.UpdateOptions{})
		}
		return err
	case "merge patch", "strategic merge patch":
		var v any
		if value != "" {
			v = value
		}
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{field: map[string]any{key: v}}})
		pt := types.MergePatchType
		if verb == "strategic merge patch" {
			pt = types.StrategicMergePatchType
		}
		return patch(pt, body, metav1.PatchOptions{})
	case "JSON patch":
		op := "add" // adds or replaces a map key
		if value == "" {
			op = "remove"
		}
		return patch(types.JSONPatchType, jsonPatch(op, field, key, value), metav1.PatchOptions{})
	case "apply":
		return patch(types.ApplyPatchType, applyPatch(node, field, key, value), metav1.PatchOptions{FieldManager: "thief", Force: ptr.To(true)})
	}
	return fmt.Errorf("unknown verb %q", verb)
}

func labelPatch(key, value string) []byte {
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{key: value}}})
	return body
}

// jsonPatch is an RFC 6902 patch of one key of metadata.<field>.
func jsonPatch(op, field, key, value string) []byte {
	p := map[string]any{"op": op, "path": "/metadata/" + field + "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(key)}
	if op != "remove" {
		p["value"] = value
	}
	body, _ := json.Marshal([]any{p})
	return body
}

// applyPatch is a server-side apply configuration of one key of a Node's
// metadata.<field>.
func applyPatch(node, field, key, value string) []byte {
	body, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": node, field: map[string]string{key: value}}})
	return body
}

// wantRefusal checks that err is the policy's 403 and that its message
// names what.
func wantRefusal(t *testing.T, err error, what string) {
	t.Helper()
	wantForbidden(t, err, "ValidatingAdmissionPolicy '"+nodePolicy+"'")
	if err != nil && !strings.Contains(err.Error(), what) {
		t.Errorf("refusal does not name %s: %v", what, err)
	}
}

func wantForbidden(t *testing.T, err error, msg string) {
	t.Helper()
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), msg) {
		t.Errorf("got %v, want 403 with %q", err, msg)
	}
}

// untilRefusedByPolicy repeats a dry run of do until the policy refuses
// it: the apiserver admits with policies and RBAC that its informers have
// seen, a moment after they are stored. A dry run that succeeds, or a
// refusal for another reason, is tried again.
func untilRefusedByPolicy(t *testing.T, ctx context.Context, what string, do func(dryRun []string) error) {
	t.Helper()
	testenv.EventuallyNoError(t, what+": refused by "+nodePolicy, func() error {
		err := do([]string{metav1.DryRunAll})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), nodePolicy) {
			return nil
		}
		return fmt.Errorf("last answer: %v", err)
	})
}

// untilAllowed repeats do while RBAC forbids it (new RBAC objects reach
// the authorizer a moment after they are stored).
func untilAllowed(t *testing.T, what string, do func() error) {
	t.Helper()
	var err error
	testenv.EventuallyNoError(t, what+": allowed by RBAC", func() error {
		if err = do(); apierrors.IsForbidden(err) {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitPolicyChecked watches the policy until its status is of its current
// generation, which the status controller writes after type checking.
func waitPolicyChecked(t *testing.T, ctx context.Context, c kubernetes.Interface) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	w, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Watch(ctx,
		metav1.ListOptions{FieldSelector: "metadata.name=" + nodePolicy})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		vap, ok := ev.Object.(*admissionregistrationv1.ValidatingAdmissionPolicy)
		if ev.Type == watch.Error || !ok {
			t.Fatalf("watch %s: %v", nodePolicy, ev.Object)
		}
		if vap.Status.ObservedGeneration == vap.Generation {
			return vap
		}
	}
	t.Fatalf("watch %s ended before its status was written: %v", nodePolicy, ctx.Err())
	return nil
}

// pick returns the entries of m under keys (nil when there are none).
func pick(m map[string]string, keys ...string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}
