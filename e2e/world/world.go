// Package world builds the end-to-end world that the e2e tests and the
// demo share: a real kube-apiserver in a cloud network, tether-gateway on a
// cloud host, edge sites behind NAT with tether-edge and a stand-in kubelet
// on every edge node (or a full kubelet on containerd, realkubelet.go), and
// a cloud client host. Everything runs in network namespaces made by
// internal/testenv and is removed at cleanup.
package world

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/testenv"
)

// Ports of the design (docs/design.md, "Ports and names").
const (
	TunnelPort  = 10262
	ProxyPort   = 10263
	AdminPort   = 10265
	KubeletPort = 10250
)

// Zone is the DNS zone the e2e gateways serve node names under.
const Zone = "tether.internal"

// Labels Tether reads (OpenYurt's).
const (
	EdgeLabel = openyurt.EdgeLabel
	PoolLabel = openyurt.PoolLabel
)

// Options shape the world; the zero value is the demo's world.
type Options struct {
	// Sites lists the edge sites; default: site-a with edge-1 and site-b
	// with edge-2, on different LANs so that node IPs are unique (node-ip mode).
	Sites []testenv.SiteSpec
	// Gateways is the number of gateway replicas (cloud hosts gw1, gw2, ...); default 1.
	Gateways int
	// APIServerArgs are extra kube-apiserver flags.
	APIServerArgs []string
	// KubeletCA signs the stand-in kubelets' serving certificates;
	// default a new CA.
	KubeletCA *testenv.CA
	// RealKubelets names the edge nodes that run no stand-in: the test
	// starts a full kubelet there (StartRealKubelet). With any, the
	// apiserver reaches kubelets by InternalIP with a client certificate
	// of KubeletClientCA and verifies them by KubeletCA.
	RealKubelets []string
	// PodCIDRs gives every edge Node a pod range of its own, EdgePodCIDR
	// of its place in the world (10.244.1.0/24, 10.244.2.0/24, ...),
	// in spec.podCIDRs (see Edge.PodCIDR). Sites may share a LAN; pod
	// ranges never repeat.
	PodCIDRs bool
}

// EdgePodCIDRs holds every edge's pod range (Options.PodCIDRs): the
// cluster's pod range as an operator gives it to the gateway.
var EdgePodCIDRs = netip.MustParsePrefix("10.244.0.0/16")

// EdgePodCIDR is the pod range of the i-th edge of a world (from 0):
// 10.244.<i+1>.0/24, inside EdgePodCIDRs.
func EdgePodCIDR(i int) netip.Prefix {
	if i < 0 || i > 254 {
		panic(fmt.Sprintf("world: no pod range for edge %d", i))
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 0}), 24)
}

// World is the running world.
type World struct {
	Topo     *testenv.Topology
	CP       *testenv.ControlPlane
	Gateways []*testenv.Host
	Client   *testenv.Host
	Edges    []*Edge

	// ClusterCA is the apiserver's client CA: it signs node and gateway
	// client certificates. GatewayCA signs the gateways' serving
	// certificates; KubeletCA the stand-in kubelets' serving certificates
	// (the cloud client trusts only it, so a successful request proves TLS
	// went end to end to the kubelet).
	ClusterCA, GatewayCA, KubeletCA *testenv.CA
	// KubeletClientCA signs the apiserver's client certificate toward
	// real kubelets (Options.RealKubelets), the one client they accept.
	KubeletClientCA *testenv.CA

	Dir  string
	Bins Binaries

	gatewayKubeconfig string
	procs             map[*testenv.Host]*exec.Cmd
	podCIDRs          bool
}

// Edge is an edge node of the world.
type Edge struct {
	Name string
	Site *testenv.Site
	Host *testenv.Host
	// CertFile and KeyFile are the node's client certificate (the
	// kubelet's identity, CN=system:node:<name>).
	CertFile, KeyFile string
	// Kubelet is the stand-in kubelet; nil on a node of
	// Options.RealKubelets.
	Kubelet *Kubelet
	// PodCIDR is the Node's spec.podCIDRs (Options.PodCIDRs), written by
	// the admin when it made the Node, before any kubelet ran there: as
	// kube-controller-manager's node IPAM does, never the node's own
	// credential. A real kubelet's pods get addresses in it. Zero without
	// Options.PodCIDRs.
	PodCIDR netip.Prefix
}

// Binaries are the programs under test.
type Binaries struct{ Gateway, Edge, Ctl string }

// RepoRoot is the directory of the repository this package is built from.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// BuildBinaries builds tether-gateway, tether-edge and tetherctl into dir.
func BuildBinaries(dir string) (Binaries, error) {
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/tether-gateway", "./cmd/tether-edge", "./cmd/tetherctl")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("build binaries: %v\n%s", err, out)
	}
	return Binaries{
		Gateway: filepath.Join(dir, "tether-gateway"),
		Edge:    filepath.Join(dir, "tether-edge"),
		Ctl:     filepath.Join(dir, "tetherctl"),
	}, nil
}

// New builds the network and the control plane, registers the edge Nodes
// and starts the stand-in kubelets. Gateways and edges are started with
// StartGateway and StartEdge, so tests can stop and restart them.
func New(t testenv.T, bins Binaries, opts Options, logf func(string, ...any)) *World {
	t.Helper()
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if opts.Gateways == 0 {
		opts.Gateways = 1
	}
	if opts.Sites == nil {
		opts.Sites = []testenv.SiteSpec{
			{Name: "site-a", Hosts: []string{"edge-1"}, LAN: netip.MustParsePrefix("192.168.1.0/24")},
			{Name: "site-b", Hosts: []string{"edge-2"}, LAN: netip.MustParsePrefix("192.168.2.0/24")},
		}
	}
	dir, err := os.MkdirTemp("", "tether-world-")
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	w := &World{Dir: dir, Bins: bins, procs: map[*testenv.Host]*exec.Cmd{}, podCIDRs: opts.PodCIDRs}

	cloud := []string{"apiserver", "client"}
	for i := 1; i <= opts.Gateways; i++ {
		cloud = append(cloud, fmt.Sprintf("gw%d", i))
	}
	logf("network: cloud LAN with %s; %d edge sites behind NAT", strings.Join(cloud, ", "), len(opts.Sites))
	w.Topo = testenv.NewTopology(t, testenv.TopologySpec{CloudHosts: cloud, Sites: opts.Sites})
	w.Client = w.Topo.Cloud("client")
	for i := 1; i <= opts.Gateways; i++ {
		w.Gateways = append(w.Gateways, w.Topo.Cloud(fmt.Sprintf("gw%d", i)))
	}

	if w.KubeletCA = opts.KubeletCA; w.KubeletCA == nil {
		w.KubeletCA = testenv.MustCA(t, "kubelet-serving-ca")
	}
	apiArgs := opts.APIServerArgs
	if len(opts.RealKubelets) > 0 {
		apiArgs = append(w.kubeletClientArgs(t), apiArgs...)
	}
	logf("control plane: etcd and kube-apiserver (built from their Go modules) on the apiserver host")
	api := w.Topo.Cloud("apiserver")
	w.CP = testenv.StartControlPlane(t, testenv.ControlPlaneOptions{Runner: api, BindAddress: api.Addr.String(), ExtraAPIServerArgs: apiArgs})
	w.ClusterCA = w.CP.CA
	w.GatewayCA = testenv.MustCA(t, "tether-gateway-ca")
	w.writeCAs(t)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rbac := filepath.Join(RepoRoot(), "packaging", "kubernetes", "gateway-rbac.yaml")
	if err := testenv.ApplyManifests(ctx, w.CP.Admin, false, rbac); err != nil {
		t.Fatalf("apply %s: %v", rbac, err)
	}
	gwCert, err := w.ClusterCA.ClientCert("tether-gateway")
	if err != nil {
		t.Fatalf("%v", err)
	}
	w.gatewayKubeconfig = w.CP.Kubeconfig(t, "tether-gateway", gwCert)

	for _, site := range w.Topo.Sites {
		for _, h := range site.Hosts {
			standIn := !slices.Contains(opts.RealKubelets, h.Label)
			e := w.addEdge(t, ctx, site, h, standIn)
			pods := ""
			if e.PodCIDR.IsValid() {
				pods = ", pods " + e.PodCIDR.String()
			}
			if standIn {
				logf("edge node %s at %s in %s (LAN %s, NAT %s%s), stand-in kubelet on :%d", e.Name, h.Addr, site.Name, site.LAN, site.PublicAddr, pods, KubeletPort)
			} else {
				logf("edge node %s at %s in %s (LAN %s, NAT %s%s), for a real kubelet", e.Name, h.Addr, site.Name, site.LAN, site.PublicAddr, pods)
			}
		}
	}
	return w
}

func (w *World) writeCAs(t testenv.T) {
	t.Helper()
	for name, ca := range map[string]*testenv.CA{"cluster-ca": w.ClusterCA, "gateway-ca": w.GatewayCA, "kubelet-ca": w.KubeletCA} {
		if _, err := ca.WriteFile(w.Dir, name); err != nil {
			t.Fatalf("%v", err)
		}
	}
}

// Path is a file in the world's directory.
func (w *World) Path(name string) string { return filepath.Join(w.Dir, name) }

func (w *World) addEdge(t testenv.T, ctx context.Context, site *testenv.Site, h *testenv.Host, standIn bool) *Edge {
	t.Helper()
	name := h.Label
	e := &Edge{Name: name, Site: site, Host: h}
	kp, err := w.ClusterCA.NodeCert(name)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if e.CertFile, e.KeyFile, err = kp.WriteFiles(w.Dir, name); err != nil {
		t.Fatalf("%v", err)
	}
	if standIn {
		e.Kubelet = StartKubelet(t, h, name, w.KubeletCA)
	}

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{EdgeLabel: "true", PoolLabel: site.Name, corev1.LabelHostname: name},
	}}
	if w.podCIDRs {
		e.PodCIDR = EdgePodCIDR(len(w.Edges))
		node.Spec.PodCIDR = e.PodCIDR.String()
		node.Spec.PodCIDRs = []string{e.PodCIDR.String()}
	}
	created, err := w.CP.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	created.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: h.Addr.String()},
		{Type: corev1.NodeHostName, Address: name},
	}
	created.Status.DaemonEndpoints.KubeletEndpoint.Port = KubeletPort
	if _, err := w.CP.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set addresses of node %s: %v", name, err)
	}
	w.Edges = append(w.Edges, e)
	return e
}

// Edge returns the edge with that node name.
func (w *World) Edge(name string) *Edge {
	for _, e := range w.Edges {
		if e.Name == name {
			return e
		}
	}
	return nil
}

// GatewayArgs are the flags a gateway of this world runs with.
func (w *World) GatewayArgs(gw *testenv.Host, t testenv.T) []string {
	t.Helper()
	kp, err := w.GatewayCA.ServerCert(gw.Label, gw.Addr.String(), gw.Label)
	if err != nil {
		t.Fatalf("%v", err)
	}
	cert, key, err := kp.WriteFiles(w.Dir, gw.Label+"-serving")
	if err != nil {
		t.Fatalf("%v", err)
	}
	return []string{
		"--kubeconfig", w.gatewayKubeconfig,
		"--client-ca", w.Path("cluster-ca.crt"),
		"--tls-cert", cert, "--tls-key", key,
		"--tunnel-listen", fmt.Sprintf(":%d", TunnelPort),
		"--proxy-port", fmt.Sprint(ProxyPort),
		"--admin-listen", fmt.Sprintf("%s:%d", gw.Addr, AdminPort),
		"--log-level", "debug",
	}
}

// StartGateway starts tether-gateway on gw with the world's flags plus extra.
func (w *World) StartGateway(t testenv.T, gw *testenv.Host, extra ...string) *exec.Cmd {
	t.Helper()
	cmd := gw.Start(t, w.Bins.Gateway, append(w.GatewayArgs(gw, t), extra...)...)
	w.procs[gw] = cmd
	return cmd
}

// Stop stops the Tether process that Start{Gateway,Edge} started on h
// (SIGTERM, then SIGKILL after a grace period).
func (w *World) Stop(h *testenv.Host) error {
	cmd := w.procs[h]
	if cmd == nil {
		return fmt.Errorf("nothing started on %s", h)
	}
	delete(w.procs, h)
	return h.Stop(cmd)
}

// Kill ends the Tether process on h with SIGKILL: no goodbye to its peers.
func (w *World) Kill(h *testenv.Host) error {
	cmd := w.procs[h]
	if cmd == nil {
		return fmt.Errorf("nothing started on %s", h)
	}
	delete(w.procs, h)
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return err
	}
	return h.Wait(context.Background(), cmd)
}

// Log is the output of the Tether process running on h.
func (w *World) Log(h *testenv.Host) string {
	if cmd := w.procs[h]; cmd != nil {
		return h.Log(cmd)
	}
	return ""
}

// EdgeArgs are the flags an edge of this world runs with: it dials every
// gateway replica.
func (w *World) EdgeArgs(e *Edge) []string {
	var gws []string
	for _, gw := range w.Gateways {
		gws = append(gws, fmt.Sprintf("%s:%d", gw.Addr, TunnelPort))
	}
	return []string{
		"--gateway", strings.Join(gws, ","),
		"--gateway-ca", w.Path("gateway-ca.crt"),
		"--cert", e.CertFile, "--key", e.KeyFile,
		"--allow-ports", fmt.Sprint(KubeletPort),
		"--cert-check-interval", "1s",
		"--log-level", "debug",
	}
}

// StartEdge starts tether-edge on e's host with the world's flags plus extra.
func (w *World) StartEdge(t testenv.T, e *Edge, extra ...string) *exec.Cmd {
	t.Helper()
	cmd := e.Host.Start(t, w.Bins.Edge, append(w.EdgeArgs(e), extra...)...)
	w.procs[e.Host] = cmd
	return cmd
}

// RouteSitesVia routes every site LAN from the client host to gw, as a VPC
// route table does in node-ip mode ("the VPC routes the edge ranges to the
// gateway").
func (w *World) RouteSitesVia(t testenv.T, gw *testenv.Host) {
	t.Helper()
	for _, s := range w.Topo.Sites {
		w.RouteVia(t, s.LAN, gw)
	}
}

// RouteVia routes prefix from the client host to gw.
func (w *World) RouteVia(t testenv.T, prefix netip.Prefix, gw *testenv.Host) {
	t.Helper()
	w.Client.Run(t, "ip", "route", "replace", prefix.String(), "via", gw.Addr.String())
}

// Curl runs curl on the client host against the URL, trusting only the
// kubelet CA, and returns its output.
func (w *World) Curl(ctx context.Context, url string, extra ...string) (string, error) {
	args := append([]string{"--silent", "--show-error", "--fail", "--max-time", "10", "--cacert", w.Path("kubelet-ca.crt")}, extra...)
	out, err := w.Client.Command(ctx, "curl", append(args, url)...).CombinedOutput()
	return string(out), err
}

// KubeletURL is the URL of path on e's kubelet, by the node's address.
func (e *Edge) KubeletURL(path string) string {
	return fmt.Sprintf("https://%s:%d%s", e.Host.Addr, KubeletPort, path)
}

// WaitReachable retries until the client host reaches every edge's
// kubelet through the tunnel, or the timeout ends.
func (w *World) WaitReachable(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, e := range w.Edges {
		for {
			out, err := w.Curl(ctx, e.KubeletURL("/healthz"), "--max-time", "2")
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("edge %s not reachable through the tunnel within %v: %v: %s", e.Name, timeout, err, out)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}
