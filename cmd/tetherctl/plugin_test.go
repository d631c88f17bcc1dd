package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/retired"
	"github.com/tether-edge/tether/internal/testenv"
)

func TestProgName(t *testing.T) {
	for argv0, want := range map[string]string{
		"tetherctl":                      "tetherctl",
		"/usr/bin/tetherctl":             "tetherctl",
		"/usr/bin/kubectl-tether":        "kubectl tether",
		"kubectl-tether":                 "kubectl tether",
		"/home/op/bin/kubectl-tether-ng": "tetherctl",
	} {
		if got := progName(argv0); got != want {
			t.Errorf("progName(%q) = %q, want %q", argv0, got, want)
		}
	}
}

// TestKubectlPlugin installs tetherctl as kubectl-tether (a symlink, as the
// packages do) in a directory that is the whole $PATH, and runs it through
// the real kubectl's plugin discovery against a real kube-apiserver.
func TestKubectlPlugin(t *testing.T) {
	kubectl := filepath.Join(filepath.Dir(testenv.Binaries(t).KubeAPIServer), "kubectl")
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "tetherctl"), ".").CombinedOutput(); err != nil {
		t.Fatalf("go build tetherctl: %v\n%s", err, out)
	}
	if err := os.Symlink("tetherctl", filepath.Join(bin, PluginName)); err != nil {
		t.Fatal(err)
	}

	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Labels: map[string]string{openyurt.PoolLabel: "shop"}}}
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A kubeconfig whose current context is an apiserver that is not
	// there, and whose "testenv" context is the real one: only --context
	// reaches it.
	kc, err := clientcmd.LoadFromFile(cp.AdminKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kc.Clusters["gone"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	kc.Contexts["gone"] = &clientcmdapi.Context{Cluster: "gone", AuthInfo: kc.Contexts[kc.CurrentContext].AuthInfo}
	adminContext := kc.CurrentContext
	kc.CurrentContext = "gone"
	twoContexts := filepath.Join(t.TempDir(), "config")
	if err := clientcmd.WriteToFile(*kc, twoContexts); err != nil {
		t.Fatal(err)
	}

	kubectlRun := func(env []string, args ...string) (stdout, stderr string, err error) {
		t.Helper()
		cmd := exec.CommandContext(ctx, kubectl, args...)
		cmd.Env = append([]string{"PATH=" + bin, "HOME=" + t.TempDir()}, env...)
		var o, e strings.Builder
		cmd.Stdout, cmd.Stderr = &o, &e
		err = cmd.Run()
		return o.String(), e.String(), err
	}

	t.Run("plugin list", func(t *testing.T) {
		out, errOut, err := kubectlRun(nil, "plugin", "list")
		if err != nil || !strings.Contains(out, filepath.Join(bin, PluginName)) || strings.Contains(out+errOut, "warning") {
			t.Errorf("kubectl plugin list: %v; want %s listed without warnings:\n%s%s", err, filepath.Join(bin, PluginName), out, errOut)
		}
	})

	// wantShop checks the pools table of the cluster: one pool, shop.
	wantShop := func(t *testing.T, out, errOut string, err error) {
		t.Helper()
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if err != nil || len(lines) != 2 || !strings.HasPrefix(lines[0], "POOL ") || strings.Fields(lines[1])[0] != "shop" {
			t.Errorf("%v; want the pools table with shop:\n%s%s", err, out, errOut)
		}
	}
	t.Run("pools --kubeconfig", func(t *testing.T) {
		out, errOut, err := kubectlRun(nil, "tether", "pools", "--kubeconfig", cp.AdminKubeconfig)
		wantShop(t, out, errOut, err)
	})
	t.Run("pools --context", func(t *testing.T) {
		out, errOut, err := kubectlRun(nil, "tether", "pools", "--kubeconfig", twoContexts, "--context", adminContext)
		wantShop(t, out, errOut, err)
		// $KUBECONFIG, as kubectl itself reads it.
		out, errOut, err = kubectlRun([]string{"KUBECONFIG=" + twoContexts}, "tether", "pools", "--context", adminContext)
		wantShop(t, out, errOut, err)
		// Without --context: the current context, which is not there.
		out, errOut, err = kubectlRun([]string{"KUBECONFIG=" + twoContexts}, "tether", "--timeout", "2s", "pools")
		if err == nil || !strings.Contains(errOut, "kubectl tether pools:") || !strings.Contains(errOut, "127.0.0.1:1") {
			t.Errorf("the current context's apiserver is not there: %v\n%s%s", err, out, errOut)
		}
	})
	t.Run("usage", func(t *testing.T) {
		out, _, err := kubectlRun(nil, "tether", "help")
		if err != nil || !strings.HasPrefix(out, "Usage: kubectl tether [flags] <command>") || !strings.Contains(out, "-context") {
			t.Errorf("kubectl tether help: %v\n%s", err, out)
		}
		_, errOut, err := kubectlRun(nil, "tether", "frobnicate")
		if err == nil || !strings.Contains(errOut, `kubectl tether: unknown command "frobnicate"`) {
			t.Errorf("kubectl tether frobnicate: %v\n%s", err, errOut)
		}
	})
	t.Run("node retire", func(t *testing.T) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: retired.Namespace}}
		if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		out, errOut, err := kubectlRun(nil, "tether", "node", "retire", "edge-1", "--kubeconfig", twoContexts, "--context", adminContext)
		if err != nil || !strings.HasPrefix(out, "node edge-1 retired at ") {
			t.Errorf("kubectl tether node retire: %v\n%s%s", err, out, errOut)
		}
		out, errOut, err = kubectlRun(nil, "tether", "--kubeconfig", cp.AdminKubeconfig, "node", "retired")
		if lines := strings.Split(strings.TrimSpace(out), "\n"); err != nil || len(lines) != 2 || strings.Fields(lines[1])[0] != "edge-1" {
			t.Errorf("kubectl tether node retired: %v\n%s%s", err, out, errOut)
		}
		_, errOut, err = kubectlRun(nil, "tether", "node", "retire", "--kubeconfig", cp.AdminKubeconfig)
		if err == nil || !strings.Contains(errOut, "kubectl tether node: want `kubectl tether node retire NAME`") {
			t.Errorf("kubectl tether node retire without a name: %v\n%s", err, errOut)
		}
	})
}
