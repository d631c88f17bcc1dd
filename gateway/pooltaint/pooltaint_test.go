package pooltaint

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/testenv"
)

// other is a taint of someone else's, which the controller must keep.
var other = corev1.Taint{Key: "example.com/dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}

type fixture struct {
	t     *testing.T
	ctx   context.Context
	admin kubernetes.Interface
	c     *Controller
	last  map[string]time.Time // last renewTime written, by node
}

// start runs the controller with the gateway's identity against a real
// apiserver, with nodes edge-1 (with another taint), edge-2 and edge-3
// (with a stale taint of this controller's).
func start(t *testing.T) *fixture {
	t.Helper()
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, "../../packaging/kubernetes/gateway-rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	for name, taints := range map[string][]corev1.Taint{"edge-1": {other}, "edge-2": nil, "edge-3": {other, Taint}} {
		n, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Admission gave the new node node.kubernetes.io/not-ready; the
		// test's nodes have the taints it says.
		n.Spec.Taints = taints
		if _, err := cp.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kp, err := cp.CA.ClientCert("tether-gateway")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := kubernetes.NewForConfig(cp.RESTConfig(kp))
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(gw, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	testenv.Eventually(t, "the controller sees every renewal", c.HasSynced)
	return &fixture{t: t, ctx: ctx, admin: cp.Client, c: c, last: map[string]time.Time{}}
}

// renew writes a renewal of node's Lease, as the kubelet (annotated
// false) or the gateway for a delegated heartbeat (true) does.
func (f *fixture) renew(node string, annotated bool) {
	f.t.Helper()
	leases := f.admin.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	at := time.Now()
	if last, ok := f.last[node]; ok && !at.After(last) {
		at = last.Add(time.Millisecond)
	}
	f.last[node] = at
	l, err := leases.Get(f.ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40)}}
	} else if err != nil {
		f.t.Fatal(err)
	}
	l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(at))
	if annotated {
		l.Annotations = map[string]string{openyurt.DelegateHeartbeatAnnotation: "true"}
	} else {
		delete(l.Annotations, openyurt.DelegateHeartbeatAnnotation)
	}
	if l.ResourceVersion == "" {
		_, err = leases.Create(f.ctx, l, metav1.CreateOptions{})
	} else {
		_, err = leases.Update(f.ctx, l, metav1.UpdateOptions{})
	}
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) taints(node string) []corev1.Taint {
	f.t.Helper()
	n, err := f.admin.CoreV1().Nodes().Get(f.ctx, node, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return n.Spec.Taints
}

// waitTaints waits until node's taints are want.
func (f *fixture) waitTaints(node string, want ...corev1.Taint) {
	f.t.Helper()
	testenv.EventuallyNoError(f.t, "the taints of "+node, func() error {
		if got := f.taints(node); !cmp.Equal(got, want) {
			return fmt.Errorf("%v, want %v", got, want)
		}
		return nil
	})
}

func (f *fixture) changes(action string) float64 {
	f.t.Helper()
	v, err := metrictest.Value(f.c.changes, "tether_gateway_delegated_heartbeat_taint_changes_total", "action="+action, "result=ok")
	if err != nil {
		f.t.Fatal(err)
	}
	return v
}

// The controller handles renewals in the order the Lease watch delivers
// them, one at a time, so once a change caused by a later renewal of
// another node is seen, every earlier renewal has been handled: edge-2 is
// the probe that shows that edge-1 was left alone.
func TestTaint(t *testing.T) {
	f := start(t)

	// A stale taint on a node that renews its Lease itself goes; the
	// other taint stays.
	f.renew("edge-3", false)
	f.waitTaints("edge-3", other)

	// Three delegated renewals: no taint yet.
	for range 3 {
		f.renew("edge-1", true)
	}
	for range DefaultThreshold {
		f.renew("edge-2", true)
	}
	f.waitTaints("edge-2", Taint)
	if got := f.taints("edge-1"); !cmp.Equal(got, []corev1.Taint{other}) {
		t.Fatalf("taints of edge-1 after 3 delegated renewals: %v, want only %v", got, other)
	}

	// The fourth: tainted, the other taint kept.
	f.renew("edge-1", true)
	f.waitTaints("edge-1", other, Taint)
	testenv.Eventually(t, "the informer sees two tainted nodes", func() bool { return f.c.Tainted() == 2 })

	// More delegated renewals change nothing.
	f.renew("edge-1", true)
	f.renew("edge-2", false) // probe: untaints edge-2
	f.waitTaints("edge-2")
	if got := f.taints("edge-1"); !cmp.Equal(got, []corev1.Taint{other, Taint}) {
		t.Fatalf("taints of edge-1: %v", got)
	}

	// The node renews itself: untainted, the other taint kept.
	f.renew("edge-1", false)
	f.waitTaints("edge-1", other)

	// The streak starts over: three delegated renewals do not taint.
	for range 3 {
		f.renew("edge-1", true)
	}
	for range DefaultThreshold {
		f.renew("edge-2", true)
	}
	f.waitTaints("edge-2", Taint)
	if got := f.taints("edge-1"); !cmp.Equal(got, []corev1.Taint{other}) {
		t.Fatalf("taints of edge-1 after the streak started over: %v, want only %v", got, other)
	}

	if taint, untaint := f.changes(actionTaint), f.changes(actionUntaint); taint != 3 || untaint != 3 {
		t.Errorf("changes: %v taint, %v untaint; want 3 and 3", taint, untaint)
	}
}

// A Lease update that is not a renewal (renewTime unchanged) does not
// count toward the streak.
func TestOnlyRenewalsCount(t *testing.T) {
	f := start(t)
	for range DefaultThreshold - 1 {
		f.renew("edge-1", true)
	}
	leases := f.admin.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	for i := range 3 {
		l, err := leases.Get(f.ctx, "edge-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		l.Labels = map[string]string{"touch": string(rune('a' + i))}
		if _, err := leases.Update(f.ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for range DefaultThreshold {
		f.renew("edge-2", true)
	}
	f.waitTaints("edge-2", Taint)
	if got := f.taints("edge-1"); !cmp.Equal(got, []corev1.Taint{other}) {
		t.Fatalf("taints of edge-1: %v, want only %v", got, other)
	}
	f.renew("edge-1", true)
	f.waitTaints("edge-1", other, Taint)
}

func TestTaintsPatch(t *testing.T) {
	b, err := taintsPatch("42", nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"metadata":{"resourceVersion":"42"},"spec":{"taints":[]}}`; string(b) != want {
		t.Errorf("patch %s, want %s", b, want)
	}
}
