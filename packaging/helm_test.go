package packaging_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/tether-edge/tether/internal/testenv"
)

const (
	chartDir        = "helm/tether"
	chartAllValues  = "helm/tether/ci/all-values.yaml"
	chartAlertsCopy = "helm/tether/files/alerts.yaml"
	manifestDir     = "kubernetes"
)

// helmLabels are the labels the chart adds to every object's metadata
// (templates/_helpers.tpl), which packaging/kubernetes does not have.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/part-of"}

// The manifests that the chart renders with its default values; the others
// (edge-daemonset.yaml, gateway-hosts-configmap-rbac.yaml,
// edge-bootstrap-rbac.yaml) are optional and off by default.
var defaultManifests = []string{"gateway-rbac.yaml", "gateway.yaml", "edge-rbac.yaml", "pool-rbac.yaml", "node-admission.yaml"}

// helm runs the helm that tools/build-testbins.sh builds, with its
// configuration and cache in a temporary directory (never the user's).
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(testenv.Binaries(t).Helm, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"), "KUBECONFIG=/dev/null")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// render is `helm template` of the chart into tether-system with extra
// arguments (values), as parsed objects.
func render(t *testing.T, args ...string) []map[string]any {
	t.Helper()
	out, err := helm(t, append([]string{"template", "tether", chartDir, "--namespace", "tether-system"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects([]byte(out))
	if err != nil {
		t.Fatalf("helm template %s: %v", strings.Join(args, " "), err)
	}
	return objs
}

// decodeObjects parses a multi-document YAML stream (empty documents
// skipped) into generic objects, numbers as JSON's.
func decodeObjects(data []byte) ([]map[string]any, error) {
	var objs []map[string]any
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, err
		}
		if len(obj) > 0 {
			objs = append(objs, obj)
		}
	}
}

// manifestObjects parses files of packaging/kubernetes.
func manifestObjects(t *testing.T, files ...string) []map[string]any {
	t.Helper()
	var objs []map[string]any
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(manifestDir, f))
		if err != nil {
			t.Fatal(err)
		}
		o, err := decodeObjects(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		objs = append(objs, o...)
	}
	return objs
}

func str(obj map[string]any, path ...string) string {
	v, _ := dig(obj, path...).(string)
	return v
}

func dig(obj any, path ...string) any {
	for _, p := range path {
		m, ok := obj.(map[string]any)
		if !ok {
			return nil
		}
		obj = m[p]
	}
	return obj
}

// objectKey names an object: Kind namespace/name.
func objectKey(obj map[string]any) string {
	return fmt.Sprintf("%s %s/%s", str(obj, "kind"), str(obj, "metadata", "namespace"), str(obj, "metadata", "name"))
}

// normalize removes what the chart adds on purpose (its labels, the pod
// templates' checksum/ annotations) and parses the configuration files
// that ConfigMaps carry (data keys *.yaml), whose keys helm writes in
// another order and style. It returns the objects by objectKey; a name
// given twice fails the test.
func normalize(t *testing.T, objs []map[string]any) map[string]map[string]any {
	t.Helper()
	byKey := map[string]map[string]any{}
	for _, obj := range objs {
		if meta, ok := obj["metadata"].(map[string]any); ok {
			if labels, ok := meta["labels"].(map[string]any); ok {
				for _, l := range helmLabels {
					delete(labels, l)
				}
				if len(labels) == 0 {
					delete(meta, "labels")
				}
			}
		}
		if tmeta, ok := dig(obj, "spec", "template", "metadata").(map[string]any); ok {
			if ann, ok := tmeta["annotations"].(map[string]any); ok {
				for k := range ann {
					if strings.HasPrefix(k, "checksum/") {
						delete(ann, k)
					}
				}
				if len(ann) == 0 {
					delete(tmeta, "annotations")
				}
			}
		}
		if str(obj, "kind") == "ConfigMap" {
			if data, ok := obj["data"].(map[string]any); ok {
				for k, v := range data {
					if s, ok := v.(string); ok && strings.HasSuffix(k, ".yaml") {
						var parsed any
						if err := yaml.Unmarshal([]byte(s), &parsed); err != nil {
							t.Fatalf("%s: data %s: %v", objectKey(obj), k, err)
						}
						data[k] = parsed
					}
				}
			}
		}
		k := objectKey(obj)
		if _, dup := byKey[k]; dup {
			t.Errorf("%s twice", k)
		}
		byKey[k] = obj
	}
	return byKey
}

// withoutNamespaces drops the Namespace objects: a chart does not create
// its release's namespace (helm install --create-namespace does).
func withoutNamespaces(objs []map[string]any) []map[string]any {
	return slices.DeleteFunc(objs, func(o map[string]any) bool { return str(o, "kind") == "Namespace" })
}

// compareObjects fails the test for every object that is in one set and
// not the other, or differs, showing both.
func compareObjects(t *testing.T, what string, got, want map[string]map[string]any) {
	t.Helper()
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s: the chart does not render %s", what, k)
			continue
		}
		if d := diff("", g, w); len(d) > 0 {
			t.Errorf("%s: %s differs from packaging/kubernetes (chart labels and checksum annotations aside):\n%s", what, k, strings.Join(d, "\n"))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: the chart renders %s, which packaging/kubernetes does not have", what, k)
		}
	}
}

// diff lists where got and want differ, one line per path.
func diff(path string, got, want any) []string {
	if reflect.DeepEqual(got, want) {
		return nil
	}
	switch w := want.(type) {
	case map[string]any:
		if g, ok := got.(map[string]any); ok {
			keys := map[string]bool{}
			for k := range g {
				keys[k] = true
			}
			for k := range w {
				keys[k] = true
			}
			var out []string
			for _, k := range slices.Sorted(maps.Keys(keys)) {
				out = append(out, diff(path+"."+k, g[k], w[k])...)
			}
			return out
		}
	case []any:
		if g, ok := got.([]any); ok && len(g) == len(w) {
			var out []string
			for i := range w {
				out = append(out, diff(fmt.Sprintf("%s[%d]", path, i), g[i], w[i])...)
			}
			return out
		}
	}
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	return []string{fmt.Sprintf("  %s: chart %s, manifest %s", path, gj, wj)}
}

// TestHelmLint runs `helm lint --strict` with the default values and with
// every optional part on.
func TestHelmLint(t *testing.T) {
	for _, args := range [][]string{nil, {"--values", chartAllValues}, {"--set", "gateway.kind=Deployment"}} {
		out, err := helm(t, append([]string{"lint", "--strict", "--namespace", "tether-system", chartDir}, args...)...)
		if err != nil {
			t.Error(err)
			continue
		}
		if !strings.Contains(out, "0 chart(s) failed") {
			t.Errorf("helm lint %s:\n%s", strings.Join(args, " "), out)
		}
	}
}

// TestHelmChartMatchesManifests holds the chart to packaging/kubernetes:
// with the default values it renders the objects of the manifests that are
// not optional, with every optional part on (ci/all-values.yaml) the
// objects of all of them, the same as parsed objects but for the chart's
// labels, the pod templates' checksum annotations and the Namespace
// (--create-namespace). It fails when either is changed without the other.
func TestHelmChartMatchesManifests(t *testing.T) {
	t.Run("Defaults", func(t *testing.T) {
		got := normalize(t, render(t))
		want := normalize(t, withoutNamespaces(manifestObjects(t, defaultManifests...)))
		compareObjects(t, "default values", got, want)
	})

	t.Run("AllOn", func(t *testing.T) {
		got := normalize(t, render(t, "--values", chartAllValues))
		files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
		if err != nil || len(files) < len(defaultManifests)+3 {
			t.Fatalf("manifests: %q %v", files, err)
		}
		for i := range files {
			files[i] = filepath.Base(files[i])
		}
		want := normalize(t, withoutNamespaces(manifestObjects(t, files...)))
		// The manifests leave --hosts-configmap to the operator (their
		// RBAC file's comment); the chart sets it with its RBAC.
		if cfg, ok := dig(want["ConfigMap tether-system/tether-gateway"], "data", "gateway.yaml").(map[string]any); ok {
			cfg["hosts-configmap"] = "kube-system/tether-nodes"
		} else {
			t.Fatal("packaging/kubernetes/gateway.yaml has no ConfigMap tether-gateway with gateway.yaml")
		}

		// The chart's own objects, checked here and then set aside.
		values := readYAMLMap(t, chartAllValues)
		own := map[string]func(map[string]any){
			"Secret tether-system/tether-gateway-tls": func(o map[string]any) {
				for key, value := range map[string]any{"tls.crt": dig(values, "gateway", "tls", "cert"), "tls.key": dig(values, "gateway", "tls", "key")} {
					if d, _ := base64.StdEncoding.DecodeString(str(o, "data", key)); string(d) != value || value == "" {
						t.Errorf("Secret tether-gateway-tls %s = %q, want %q", key, d, value)
					}
				}
				if str(o, "type") != "kubernetes.io/tls" {
					t.Errorf("Secret tether-gateway-tls type %q", str(o, "type"))
				}
			},
			"ConfigMap tether-system/tether-gateway-ca": func(o map[string]any) {
				if ca := dig(values, "edge", "gatewayCA", "cert"); str(o, "data", "ca.crt") != ca || ca == "" {
					t.Errorf("ConfigMap tether-gateway-ca ca.crt = %q, want %q", str(o, "data", "ca.crt"), ca)
				}
			},
			"ServiceMonitor tether-system/tether-gateway": func(o map[string]any) {
				svc := got["Service tether-system/tether-gateway"]
				if !reflect.DeepEqual(dig(o, "spec", "selector", "matchLabels"), dig(svc, "metadata", "labels")) {
					t.Errorf("ServiceMonitor selects %v, the Service has labels %v", dig(o, "spec", "selector", "matchLabels"), dig(svc, "metadata", "labels"))
				}
				eps, _ := dig(o, "spec", "endpoints").([]any)
				ports, _ := dig(svc, "spec", "ports").([]any)
				if len(eps) != 1 || !slices.ContainsFunc(ports, func(p any) bool { return dig(p, "name") == dig(eps[0], "port") }) {
					t.Errorf("ServiceMonitor endpoints %v name no port of the Service %v", eps, ports)
				}
				if str(o, "metadata", "labels", "release") != "prometheus" {
					t.Errorf("ServiceMonitor labels %v lack serviceMonitor.labels", dig(o, "metadata", "labels"))
				}
			},
			"PrometheusRule tether-system/tether": func(o map[string]any) {
				alerts := readYAMLMap(t, alertsFile)
				if groups := dig(o, "spec", "groups"); groups == nil || !reflect.DeepEqual(groups, alerts["groups"]) {
					t.Errorf("PrometheusRule's groups are not those of %s", alertsFile)
				}
				if str(o, "metadata", "labels", "release") != "prometheus" {
					t.Errorf("PrometheusRule labels %v lack prometheusRule.labels", dig(o, "metadata", "labels"))
				}
			},
		}
		for k, check := range own {
			o, ok := got[k]
			if !ok {
				t.Errorf("all values: the chart does not render %s", k)
				continue
			}
			check(o)
			delete(got, k)
		}
		compareObjects(t, "all values", got, want)
	})

	// The Deployment runs the same pod as the DaemonSet, never two on
	// one node (host network).
	t.Run("Deployment", func(t *testing.T) {
		ds := normalize(t, render(t))["DaemonSet tether-system/tether-gateway"]
		objs := normalize(t, render(t, "--set", "gateway.kind=Deployment", "--set", "gateway.replicas=3"))
		d, ok := objs["Deployment tether-system/tether-gateway"]
		if !ok || objs["DaemonSet tether-system/tether-gateway"] != nil {
			t.Fatalf("gateway.kind=Deployment renders %v", slices.Sorted(maps.Keys(objs)))
		}
		if dig(d, "spec", "replicas") != float64(3) {
			t.Errorf("replicas %v, want 3", dig(d, "spec", "replicas"))
		}
		pod, _ := dig(d, "spec", "template", "spec").(map[string]any)
		anti := dig(pod, "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
		if terms, _ := anti.([]any); len(terms) != 1 || dig(terms[0], "topologyKey") != "kubernetes.io/hostname" {
			t.Errorf("Deployment's pod anti-affinity %v, want one replica per kubernetes.io/hostname", anti)
		}
		delete(pod, "affinity")
		if !reflect.DeepEqual(dig(d, "spec", "template"), dig(ds, "spec", "template")) {
			t.Errorf("the Deployment's pod template is not the DaemonSet's:\n%v\n%v", dig(d, "spec", "template"), dig(ds, "spec", "template"))
		}
	})
}

// readYAMLMap reads a YAML file as a generic map (readYAML's strict
// decoding into it).
func readYAMLMap(t *testing.T, path string) map[string]any {
	t.Helper()
	var v map[string]any
	readYAML(t, path, &v)
	return v
}

// TestHelmChartAlertsCopy: Helm reads no file outside the chart, so the
// chart carries a copy of monitoring/alerts.yaml for its PrometheusRule.
func TestHelmChartAlertsCopy(t *testing.T) {
	orig, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := os.ReadFile(chartAlertsCopy)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(orig, cp) {
		t.Errorf("packaging/%s is not a copy of packaging/%s: cp packaging/%[2]s packaging/%[1]s", chartAlertsCopy, alertsFile)
	}
}

// TestHelmChartRefuses: values the chart cannot honour fail `helm
// template` with a message that says what to do.
func TestHelmChartRefuses(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--namespace", "tether"}, `into the namespace tether-system`},
		{[]string{"--namespace", "tether-system", "--set", "gateway.kind=StatefulSet"}, `gateway.kind must be DaemonSet or Deployment, not "StatefulSet"`},
		{[]string{"--namespace", "tether-system", "--set", "gateway.tls.cert=x"}, `gateway.tls.cert and gateway.tls.key go together`},
		{[]string{"--namespace", "tether-system", "--set", "edge.daemonset=true"}, `edge.daemonset needs edge.gateways`},
		{[]string{"--namespace", "tether-system", "--set", "gateway.hostsConfigMap=tether-nodes"}, `gateway.hostsConfigMap must be namespace/name`},
	} {
		out, err := helm(t, append([]string{"template", "tether", chartDir}, c.args...)...)
		if err == nil {
			t.Errorf("helm template %s succeeded:\n%s", strings.Join(c.args, " "), out)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("helm template %s: %v\nwant an error containing %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}
