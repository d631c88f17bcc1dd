package autonomy

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/testenv"
)

func node(name string, edge bool, ann map[string]string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann, Labels: map[string]string{}}}
	if edge {
		n.Labels[openyurt.EdgeLabel] = "true"
	}
	return n
}

func pod(name, node string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"},
		Spec: corev1.PodSpec{NodeName: node, Tolerations: defaults(300)}}
}

// TestController runs the controller on a fake clientset: the pods of the
// edge nodes that ask for autonomy, and only those, get their tolerations
// patched (after a conflict, again); when a node's annotation goes, its
// pods get their own back.
func TestController(t *testing.T) {
	ds := pod("agent", "auto")
	ds.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: "u1"}}
	mirror := pod("static", "auto")
	mirror.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "abc"}
	client := fake.NewClientset(
		node("auto", true, map[string]string{openyurt.AutonomyAnnotation: "true"}),
		node("bounded", true, map[string]string{openyurt.AutonomyDurationAnnotation: "1h"}),
		node("plain", true, nil),
		node("bad", true, map[string]string{openyurt.AutonomyDurationAnnotation: "a while"}),
		node("cloud", false, map[string]string{openyurt.AutonomyAnnotation: "true"}),
		pod("a", "auto"), ds, mirror, pod("b", "bounded"), pod("p", "plain"), pod("x", "bad"), pod("c", "cloud"),
	)
	// a's first patch conflicts, as when another replica or the kubelet
	// wrote the pod first.
	var conflicts atomic.Int32
	client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.PatchAction).GetName() == "a" && conflicts.Add(1) == 1 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "a", nil)
		}
		return false, nil, nil
	})
	c, err := New(client, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	get := func(name string) *corev1.Pod {
		p, err := client.CoreV1().Pods("shop").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	testenv.Eventually(t, "a and b patched", func() bool {
		return cmp.Equal(get("a").Spec.Tolerations, withSeconds(defaults(300), nil)) &&
			cmp.Equal(get("b").Spec.Tolerations, withSeconds(defaults(300), ptr.To[int64](3600)))
	})
	for _, name := range []string{"a", "b"} {
		if got, want := get(name).Annotations, map[string]string{openyurt.OriginalNotReadyTolerationAnnotation: "300",
			openyurt.OriginalUnreachableTolerationAnnotation: "300"}; !cmp.Equal(got, want) {
			t.Errorf("%s's annotations: %v, want %v", name, got, want)
		}
	}
	if n := c.Autonomous(); n != 2 {
		t.Errorf("Autonomous() = %d, want 2 (auto, bounded)", n)
	}

	// The annotation goes: a's tolerations and annotations are its own
	// again.
	n, _ := client.CoreV1().Nodes().Get(ctx, "auto", metav1.GetOptions{})
	n.Annotations = nil
	if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "a restored", func() bool {
		p := get("a")
		return cmp.Equal(p.Spec.Tolerations, defaults(300)) && len(p.Annotations) == 0
	})

	// The queue is FIFO and every pod was judged at the start: had any
	// other pod been queued for a patch, it would have been patched before
	// a was restored.
	patched := map[string]int{}
	for _, a := range client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == "pods" {
			patched[p.GetName()]++
			if p.GetPatchType() != types.StrategicMergePatchType {
				t.Errorf("patch of %s: type %s", p.GetName(), p.GetPatchType())
			}
		}
	}
	if want := map[string]int{"a": 3, "b": 1}; !cmp.Equal(patched, want) {
		t.Errorf("patches by pod: %v, want %v (a: a conflict, hold, restore)", patched, want)
	}
	// The counter moves just after the write the test saw.
	testenv.EventuallyNoError(t, "the patch counters", func() error {
		for _, m := range []struct {
			action, result string
			want           float64
		}{{actionHold, "ok", 2}, {actionHold, "error", 1}, {actionRestore, "ok", 1}, {actionRestore, "error", 0}} {
			if v, _ := metrictest.Value(c.patches, "tether_gateway_autonomy_pod_patches_total", "action="+m.action, "result="+m.result); v != m.want {
				return fmt.Errorf("patches{%s,%s} = %v, want %v", m.action, m.result, v, m.want)
			}
		}
		return nil
	})
	if v, _ := metrictest.Value(c.autonomous, "tether_gateway_autonomy_nodes"); v != 1 {
		t.Errorf("tether_gateway_autonomy_nodes = %v, want 1 (bounded)", v)
	}
}

// TestPodPatch checks the patch's shape: the resourceVersion as a
// precondition, the whole tolerations list, null for a removed annotation.
func TestPodPatch(t *testing.T) {
	b, err := podPatch("42", change{tolerations: withSeconds(defaults(300)[:1], nil),
		annotations: map[string]*string{openyurt.OriginalNotReadyTolerationAnnotation: nil}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"metadata":{"annotations":{"apps.openyurt.io/original-not-ready-toleration-duration":null},"resourceVersion":"42"},` +
		`"spec":{"tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute"}]}}`
	if string(b) != want {
		t.Errorf("patch:\n%s\nwant\n%s", b, want)
	}
}
