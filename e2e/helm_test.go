package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestHelmChart renders packaging/helm/tether with its default values, with
// every optional part on (the edge DaemonSet, the ServiceMonitor and
// PrometheusRule, whose kinds testdata/prometheus-operator-crds.yaml adds,
// the TLS Secret, the hosts ConfigMap and bootstrap RBAC) and with the
// gateway as a Deployment, and has a real kube-apiserver validate and admit
// each (server-side dry run). Then it installs the chart with helm, with
// every optional part on, and asks the apiserver what the gateway, the
// nodes and bootstrap tokens may do: the same answers as for
// packaging/kubernetes (TestKubernetesManifests, TestEdgeRBAC,
// TestEdgeBootstrapRBAC). packaging/helm_test.go holds the chart's objects
// equal to the manifests' and lints it.
func TestHelmChart(t *testing.T) {
	helmBin := testenv.Binaries(t).Helm
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	chart := filepath.Join(world.RepoRoot(), "packaging", "helm", "tether")
	// Every optional part on, and a real serving certificate and CA (the
	// values file has placeholders, which the apiserver warns about), given
	// as packaging/README.md says.
	ca := testenv.MustCA(t, "tether-gateway-ca")
	kp, err := ca.ServerCert("tether-gateway", "gateway.example.com")
	if err != nil {
		t.Fatal(err)
	}
	pki := t.TempDir()
	certFile, keyFile, err := kp.WriteFiles(pki, "gateway")
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := ca.WriteFile(pki, "gateway-ca")
	if err != nil {
		t.Fatal(err)
	}
	allValues := []string{"--values", filepath.Join(chart, "ci", "all-values.yaml"), "--set-file",
		"gateway.tls.cert=" + certFile + ",gateway.tls.key=" + keyFile + ",edge.gatewayCA.cert=" + caFile}
	home := t.TempDir()
	helm := func(args ...string) (string, error) {
		t.Helper()
		cmd := exec.CommandContext(ctx, helmBin, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.AdminKubeconfig, "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
			"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if err != nil {
			t.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String(), err
	}

	if err := testenv.ApplyManifests(ctx, cp.Admin, false, filepath.Join("testdata", "prometheus-operator-crds.yaml")); err != nil {
		t.Fatal(err)
	}
	waitServed(t, ctx, cp, "monitoring.coreos.com/v1", "servicemonitors", "prometheusrules")
	// The dry runs of namespaced objects need their namespace; helm
	// install --create-namespace below finds it there.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tether-system"}}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name string
		args []string
		// kinds that the rendering must hold, beyond the default's
		kinds []string
	}{
		{"Defaults", nil, []string{"DaemonSet", "ValidatingAdmissionPolicy", "ClusterRoleBinding"}},
		{"AllOn", allValues, []string{"ServiceMonitor", "PrometheusRule", "Secret"}},
		{"Deployment", []string{"--set", "gateway.kind=Deployment"}, []string{"Deployment"}},
	} {
		t.Run("DryRun"+c.name, func(t *testing.T) {
			out, err := helm(append([]string{"template", "tether", chart, "--namespace", "tether-system"}, c.args...)...)
			if err != nil {
				return
			}
			for _, kind := range c.kinds {
				if !strings.Contains(out, "\nkind: "+kind+"\n") {
					t.Errorf("helm template %s renders no %s", strings.Join(c.args, " "), kind)
				}
			}
			file := filepath.Join(t.TempDir(), "rendered.yaml")
			if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := testenv.ApplyManifests(ctx, cp.Admin, true, file); err != nil {
				t.Errorf("server-side dry run of helm template %s: %v", strings.Join(c.args, " "), err)
			}
		})
	}

	out, err := helm(append([]string{"install", "tether", chart, "--namespace", "tether-system", "--create-namespace"}, allValues...)...)
	if err != nil {
		t.FailNow()
	}
	// NOTES.txt: what is left to do, and not what the values did.
	if !strings.Contains(out, "kubectl label node <cloud-node> tether.io/gateway=true") || strings.Contains(out, "create secret tls") {
		t.Errorf("helm install's notes:\n%s", out)
	}
	t.Logf("helm install:\n%s", out)
	secret, err := cp.Client.CoreV1().Secrets("tether-system").Get(ctx, "tether-gateway-tls", metav1.GetOptions{})
	if err != nil || !bytes.Equal(secret.Data["tls.crt"], kp.CertPEM) || !bytes.Equal(secret.Data["tls.key"], kp.KeyPEM) {
		t.Errorf("Secret tether-gateway-tls after helm install (%v) does not hold the certificate and key given", err)
	}
	caMap, err := cp.Client.CoreV1().ConfigMaps("tether-system").Get(ctx, "tether-gateway-ca", metav1.GetOptions{})
	if err != nil || caMap.Data["ca.crt"] != string(ca.CertPEM) {
		t.Errorf("ConfigMap tether-gateway-ca after helm install (%v) does not hold the CA given", err)
	}
	out, _ = helm("list", "--namespace", "tether-system", "--short")
	if strings.TrimSpace(out) != "tether" {
		t.Errorf("helm list: %q, want the release tether", out)
	}
	checkGatewayRBAC(t, ctx, cp)
	checkEdgeRBAC(t, ctx, cp)
	checkEdgeBootstrapRBAC(t, ctx, cp)

	// Uninstalling removes what the chart made, cluster-wide objects too.
	if _, err := helm("uninstall", "tether", "--namespace", "tether-system"); err != nil {
		t.FailNow()
	}
	if _, err := cp.Client.RbacV1().ClusterRoles().Get(ctx, "tether:gateway", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRole tether:gateway after helm uninstall: %v, want not found", err)
	}
	if _, err := cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, nodePolicy, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ValidatingAdmissionPolicy %s after helm uninstall: %v, want not found", nodePolicy, err)
	}
	if _, err := cp.Client.RbacV1().Roles("kube-system").Get(ctx, "tether:gateway:hosts-configmap", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Role kube-system/tether:gateway:hosts-configmap after helm uninstall: %v, want not found", err)
	}
}

// waitServed waits (up to 30 s) until the apiserver serves the resources
// of groupVersion, as a new CustomResourceDefinition's are once it is
// established.
func waitServed(t *testing.T, ctx context.Context, cp *testenv.ControlPlane, groupVersion string, resources ...string) {
	t.Helper()
	testenv.EventuallyNoError(t, groupVersion+" to serve "+strings.Join(resources, ", "), func() error {
		list, err := cp.Client.Discovery().ServerResourcesForGroupVersion(groupVersion)
		if ctx.Err() != nil {
			t.Fatalf("%s: %v", groupVersion, ctx.Err())
		}
		var served []string
		if err == nil {
			for _, r := range list.APIResources {
				served = append(served, r.Name)
			}
		}
		if slices.ContainsFunc(resources, func(r string) bool { return !slices.Contains(served, r) }) {
			return fmt.Errorf("it serves %v (%v)", served, err)
		}
		return nil
	})
}
