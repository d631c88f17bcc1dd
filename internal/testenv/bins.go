package testenv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// Bins holds the paths of the real components built from their Go modules
// by tools/build-testbins.sh.
type Bins struct {
	KubeAPIServer, KubeProxy, KubeControllerManager, Etcd string
	// Kubemark is the hollow node: run with --morph=kubelet it is the
	// kubelet's own code over a fake, in-memory container runtime.
	Kubemark string
	// Kubelet is the full kubelet, for tests with a real container runtime.
	Kubelet string
	// Kubectl is the command-line client.
	Kubectl string
	// Pebble is the ACME test server (StartPebble).
	Pebble string
	// Helm lints, renders and installs packaging/helm/tether.
	Helm string
	// Prometheus is the server (StartPrometheus), built without its web
	// UI's assets: its HTTP API is all the tests use.
	Prometheus string
}

var (
	binsOnce sync.Once
	bins     Bins
	binsErr  error
)

// Binaries returns the component binaries, building whatever the cache
// (~/.cache/tether, or $TETHER_CACHE_DIR) lacks. A cold build takes minutes;
// its progress goes to stderr. The script runs once per process.
func Binaries(t T) Bins {
	t.Helper()
	SkipShort(t)
	binsOnce.Do(func() { bins, binsErr = buildBinaries() })
	if binsErr != nil {
		t.Fatalf("%v", binsErr)
	}
	return bins
}

func buildBinaries() (Bins, error) {
	script, err := buildScript()
	if err != nil {
		return Bins{}, err
	}
	var out bytes.Buffer
	cmd := exec.Command("bash", script)
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return Bins{}, fmt.Errorf("build test binaries with %s: %w", script, err)
	}
	b, err := parseBins(out.Bytes())
	if err != nil {
		return Bins{}, fmt.Errorf("read output of %s: %w", script, err)
	}
	return b, nil
}

// buildScript finds tools/build-testbins.sh from this source file's path,
// or, when the binary was built with -trimpath, by walking up from the
// working directory.
func buildScript() (string, error) {
	const rel = "tools/build-testbins.sh"
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		// file is <repo>/internal/testenv/bins.go.
		p := filepath.Join(filepath.Dir(file), "..", "..", rel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find %s: %w", rel, err)
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find %s: not next to the testenv sources nor above %s", rel, dir)
		}
		dir = parent
	}
}

// parseBins reads the KEY=path lines the build script prints.
func parseBins(out []byte) (Bins, error) {
	values := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if key, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok {
			values[key] = value
		}
	}
	b := Bins{
		KubeAPIServer:         values["KUBE_APISERVER"],
		KubeProxy:             values["KUBE_PROXY"],
		KubeControllerManager: values["KUBE_CONTROLLER_MANAGER"],
		Etcd:                  values["ETCD"],
		Kubemark:              values["KUBEMARK"],
		Kubelet:               values["KUBELET"],
		Kubectl:               values["KUBECTL"],
		Pebble:                values["PEBBLE"],
		Helm:                  values["HELM"],
		Prometheus:            values["PROMETHEUS"],
	}
	var errs []error
	for _, key := range []string{"KUBE_APISERVER", "KUBE_PROXY", "KUBE_CONTROLLER_MANAGER", "KUBEMARK", "KUBELET", "KUBECTL", "ETCD", "PEBBLE", "HELM", "PROMETHEUS"} {
		if values[key] == "" {
			errs = append(errs, fmt.Errorf("no %s= line", key))
		}
	}
	return b, errors.Join(errs...)
}
