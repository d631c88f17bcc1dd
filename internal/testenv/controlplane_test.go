package testenv

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

const edgeLabel = "openyurt.io/is-edge-worker"

// TestControlPlane starts one control plane and checks, against it, what
// the tests of the other packages rely on.
func TestControlPlane(t *testing.T) {
	cp := StartControlPlane(t, ControlPlaneOptions{})

	t.Run("AdminInformerSeesNode", func(t *testing.T) { testAdminInformer(t, cp) })
	t.Run("NodeIdentity", func(t *testing.T) { testNodeIdentity(t, cp) })
	t.Run("UnknownCAUnauthorized", func(t *testing.T) { testUnknownCA(t, cp) })
	t.Run("Kubeconfigs", func(t *testing.T) { testKubeconfigs(t, cp) })
}

func testAdminInformer(t *testing.T, cp *ControlPlane) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen := make(chan *corev1.Node, 10)
	factory := informers.NewSharedInformerFactory(cp.Client, 0)
	nodes := factory.Core().V1().Nodes().Informer()
	_, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { seen <- obj.(*corev1.Node) },
		UpdateFunc: func(_, obj any) { seen <- obj.(*corev1.Node) },
	})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	defer func() { cancel(); factory.Shutdown() }() // Shutdown waits for the stopped informer
	if !cache.WaitForCacheSync(ctx.Done(), nodes.HasSynced) {
		t.Fatal("node informer did not sync")
	}

	createNode(ctx, t, cp.Client, "edge-informer", map[string]string{edgeLabel: "true"})
	for {
		select {
		case n := <-seen:
			if n.Name == "edge-informer" {
				if n.Labels[edgeLabel] != "true" {
					t.Errorf("informer saw node without label %s: %v", edgeLabel, n.Labels)
				}
				return
			}
		case <-ctx.Done():
			t.Fatal("informer never saw node edge-informer")
		}
	}
}

func testNodeIdentity(t *testing.T, cp *ControlPlane) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	createNode(ctx, t, cp.Client, "node-a", nil)
	createNode(ctx, t, cp.Client, "node-b", nil)
	nodeA, _, _ := cp.NodeClient(t, "node-a")

	// Its own Node: metadata and status may change.
	patch := []byte(`{"metadata":{"annotations":{"tether.test/owner":"node-a"}}}`)
	if _, err := nodeA.CoreV1().Nodes().Patch(ctx, "node-a", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("node-a annotating its own Node: %v", err)
	}
	own, err := nodeA.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node-a getting its own Node: %v", err)
	}
	own.Status.Conditions = append(own.Status.Conditions, corev1.NodeCondition{
		Type: "TetherTest", Status: corev1.ConditionTrue, Reason: "SelfTest",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
	})
	if _, err := nodeA.CoreV1().Nodes().UpdateStatus(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node-a updating its own status: %v", err)
	}
	got, err := cp.Client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations["tether.test/owner"] != "node-a" || !hasCondition(got, "TetherTest") {
		t.Errorf("admin sees node-a without the changes: annotations %v, conditions %v", got.Annotations, got.Status.Conditions)
	}

	// Another Node: NodeRestriction forbids changing it, and the Node
	// authorizer (AuthorizeNodeWithSelectors) even reading it.
	_, err = nodeA.CoreV1().Nodes().Patch(ctx, "node-b", types.MergePatchType, patch, metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("node-a patching node-b: got %v, want Forbidden", err)
	}
	_, err = nodeA.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("node-a getting node-b: got %v, want Forbidden", err)
	}
	// Something no node may do.
	_, err = nodeA.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "by-node-a"}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("node-a creating a namespace: got %v, want Forbidden", err)
	}
}

func testUnknownCA(t *testing.T, cp *ControlPlane) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stranger, err := MustCA(t, "unknown-ca").NodeCert("node-a")
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cp.RESTConfig(stranger))
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if !apierrors.IsUnauthorized(err) {
		t.Errorf("client certificate from an unknown CA: got %v, want Unauthorized", err)
	}
}

func testKubeconfigs(t *testing.T, cp *ControlPlane) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	createNode(ctx, t, cp.Client, "node-k", nil)

	admin := clientFromKubeconfig(t, cp.AdminKubeconfig)
	if _, err := admin.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{}); err != nil {
		t.Errorf("admin kubeconfig: %v", err)
	}
	_, _, path := cp.NodeClient(t, "node-k")
	node := clientFromKubeconfig(t, path)
	if _, err := node.CoreV1().Nodes().Get(ctx, "node-k", metav1.GetOptions{}); err != nil {
		t.Errorf("node kubeconfig getting its own Node: %v", err)
	}
	_, err := node.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("node kubeconfig listing secrets: got %v, want Forbidden", err)
	}
}

// countingRunner is the host namespace, counting what goes through it.
type countingRunner struct {
	HostRunner
	commands, dials atomic.Int32
}

func (r *countingRunner) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	r.commands.Add(1)
	return r.HostRunner.Command(ctx, name, args...)
}

func (r *countingRunner) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	r.dials.Add(1)
	return r.HostRunner.DialContext(ctx, network, addr)
}

// TestControlPlaneRunner checks that processes start and clients dial
// through the Runner, and that the apiserver serves on BindAddress with a
// certificate valid for it.
func TestControlPlaneRunner(t *testing.T) {
	r := &countingRunner{}
	cp := StartControlPlane(t, ControlPlaneOptions{BindAddress: "127.0.0.2", Runner: r})
	if u, err := url.Parse(cp.URL); err != nil || u.Hostname() != "127.0.0.2" {
		t.Errorf("URL = %q, want host 127.0.0.2", cp.URL)
	}
	if cp.Admin.Dial == nil {
		t.Error("admin rest.Config does not dial through the Runner")
	}
	dialsBefore := r.dials.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cp.Client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("admin client through the Runner: %v", err)
	}
	nodeClient, _, _ := cp.NodeClient(t, "node-r")
	createNode(ctx, t, cp.Client, "node-r", nil)
	if _, err := nodeClient.CoreV1().Nodes().Get(ctx, "node-r", metav1.GetOptions{}); err != nil {
		t.Fatalf("node client through the Runner: %v", err)
	}
	if got := r.commands.Load(); got != 2 {
		t.Errorf("Runner started %d commands, want 2 (etcd, kube-apiserver)", got)
	}
	if r.dials.Load() <= dialsBefore {
		t.Error("clients did not dial through the Runner")
	}
}

// TestControlPlaneCleanup checks that the cleanup stops the apiserver and
// removes the control plane's directory.
func TestControlPlaneCleanup(t *testing.T) {
	SkipShort(t)
	var cp *ControlPlane
	t.Run("start", func(t *testing.T) {
		cp = StartControlPlane(t, ControlPlaneOptions{})
	})
	if cp == nil {
		t.FailNow()
	}
	u, err := url.Parse(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = net.DialTimeout("tcp", u.Host, time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial %s after cleanup: got %v, want connection refused", u.Host, err)
	}
	if _, err := os.Stat(cp.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control plane dir %s after cleanup: %v", cp.Dir, err)
	}
}

func createNode(ctx context.Context, t *testing.T, c kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
}

func hasCondition(n *corev1.Node, typ corev1.NodeConditionType) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == typ {
			return true
		}
	}
	return false
}

func clientFromKubeconfig(t *testing.T, path string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("load kubeconfig %s: %v", path, err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestControlPlaneStartFailureShowsLog checks that a control plane that
// cannot start stops the caller with the apiserver's own explanation, and
// that it works with a Session (the demo's T) as well as a testing.T.
func TestControlPlaneStartFailureShowsLog(t *testing.T) {
	Binaries(t) // build outside the Session, whose Fatalf would hide a build failure
	s := &Session{Log: slog.New(slog.DiscardHandler)}
	var dir string
	err := s.Run(func() error {
		cp := StartControlPlane(s, ControlPlaneOptions{ExtraAPIServerArgs: []string{"--no-such-flag"}})
		dir = cp.Dir
		return nil
	})
	if err == nil {
		t.Fatalf("control plane with a bad apiserver flag started (dir %s)", dir)
	}
	for _, want := range []string{"kube-apiserver exited before it was ready", "kube-apiserver.log", "unknown flag: --no-such-flag"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q:\n%v", want, err)
		}
	}
}
