package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// KubeProxy is a real kube-proxy (from Binaries) running on a Host, in
// nftables mode (StartKubeProxy) or another (StartKubeProxyMode).
type KubeProxy struct {
	Host *Host
	// Node is the node it serves (hostnameOverride).
	Node string
	cmd  *exec.Cmd
}

// StartKubeProxy starts kube-proxy in nftables mode on h as node, with
// server as its apiserver and no credentials of its own: server is a
// tether-edge apiserver proxy on h (http://127.0.0.1:10261), which adds
// the node's. kube-proxy waits for its Node's InternalIP before it
// programs anything. Its rules live in h's namespace (table ip
// kube-proxy); the cleanup stops it, and the namespace takes the rules
// with it.
func StartKubeProxy(t T, h *Host, node, server string) *KubeProxy {
	t.Helper()
	return StartKubeProxyMode(t, h, node, server, "nftables")
}

// StartKubeProxyMode is StartKubeProxy in the given mode: "nftables" or
// "iptables" (its rules then are nat chains KUBE-* of the host's
// iptables, nft-compat on Debian).
func StartKubeProxyMode(t T, h *Host, node, server, mode string) *KubeProxy {
	t.Helper()
	bins := Binaries(t)
	dir, err := os.MkdirTemp("", "tether-kube-proxy-")
	if err != nil {
		t.Fatalf("kube-proxy on %s: %v", h, err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	kc := clientcmdapi.NewConfig()
	kc.Clusters["edge"] = &clientcmdapi.Cluster{Server: server}
	kc.AuthInfos["kube-proxy"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["edge"] = &clientcmdapi.Context{Cluster: "edge", AuthInfo: "kube-proxy"}
	kc.CurrentContext = "edge"
	kubeconfig := filepath.Join(dir, "kube-proxy.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatalf("kube-proxy on %s: %v", h, err)
	}
	config := filepath.Join(dir, "kube-proxy.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
hostnameOverride: %s
clientConnection:
  kubeconfig: %s
  contentType: application/vnd.kubernetes.protobuf
conntrack:
  maxPerCore: 0
nftables:
  minSyncPeriod: 0s
  syncPeriod: 30s
iptables:
  minSyncPeriod: 0s
  syncPeriod: 30s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
`, mode, node, kubeconfig), 0o644); err != nil {
		t.Fatalf("kube-proxy on %s: %v", h, err)
	}
	cmd := h.Start(t, bins.KubeProxy, "--config", config, "--v=2")
	return &KubeProxy{Host: h, Node: node, cmd: cmd}
}

// Log is what kube-proxy has logged so far.
func (k *KubeProxy) Log() string { return k.Host.Log(k.cmd) }

// serviceChainRE matches a Service's chain in kube-proxy's nftables table
// (service-<hash>-<namespace>/<name>/<protocol>/<port name>) and its body.
var serviceChainRE = regexp.MustCompile(`(?s)\tchain service-[0-9A-Z]+-([^/\s]+)/([^/\s]+)/[a-z]+/[^\s]* \{(.*?)\n\t\}`)

// endpointIPRE matches an endpoint's address in a Service chain: in the
// map of its dnat (`numgen random mod 2 map { 0 : 10.1.0.1 . 8080, ...}`,
// Services without session affinity) or in the name of the endpoint chain
// it jumps to (`goto endpoint-<hash>-<ns>/<name>/<proto>/<port name>__10.1.0.1/8080`).
var endpointIPRE = regexp.MustCompile(`(?:: |__)([0-9]+\.[0-9]+\.[0-9]+\.[0-9]+)`)

// Endpoints is the endpoint addresses kube-proxy has programmed for
// namespace/name (every port), sorted; nil when it has programmed no chain
// for it (yet), an empty list when the chain has no endpoint.
func (k *KubeProxy) Endpoints(ctx context.Context, namespace, name string) ([]string, error) {
	rules, err := k.Rules(ctx)
	if err != nil {
		return nil, err
	}
	return serviceEndpoints(rules, namespace, name), nil
}

// serviceEndpoints is Endpoints read from the text of kube-proxy's table.
func serviceEndpoints(rules, namespace, name string) []string {
	var ips []string
	found := false
	for _, m := range serviceChainRE.FindAllStringSubmatch(rules, -1) {
		if m[1] != namespace || m[2] != name {
			continue
		}
		found = true
		for _, ip := range endpointIPRE.FindAllStringSubmatch(m[3], -1) {
			if !slices.Contains(ips, ip[1]) {
				ips = append(ips, ip[1])
			}
		}
	}
	if !found {
		return nil
	}
	slices.Sort(ips)
	if ips == nil {
		ips = []string{}
	}
	return ips
}

// ServiceChain is the text of kube-proxy's nftables chain for
// namespace/name (its first port), as `nft list` prints it, or "".
func (k *KubeProxy) ServiceChain(ctx context.Context, namespace, name string) (string, error) {
	rules, err := k.Rules(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range serviceChainRE.FindAllStringSubmatch(rules, -1) {
		if m[1] == namespace && m[2] == name {
			return strings.TrimPrefix(m[0], "\t"), nil
		}
	}
	return "", nil
}

// Rules is kube-proxy's nftables table (`nft list table ip kube-proxy`).
func (k *KubeProxy) Rules(ctx context.Context) (string, error) {
	out, err := k.Host.Command(ctx, "nft", "list", "table", "ip", "kube-proxy").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("nft list table ip kube-proxy on %s: %v: %s", k.Host, err, out)
	}
	return string(out), nil
}
