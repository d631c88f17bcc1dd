package testenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	// readyTimeout bounds how long StartControlPlane waits for etcd and
	// then for the apiserver's /readyz (ready takes 2-4 s here).
	readyTimeout = 60 * time.Second
	// componentStopGrace is how long etcd or the apiserver may take to
	// exit after SIGTERM before its process group is killed.
	componentStopGrace = 5 * time.Second
	// logTailLines is how much of a component's log a failure shows.
	logTailLines = 40

	serviceCIDR = "10.96.0.0/16"
	// firstServiceIP is the ClusterIP of the "kubernetes" Service.
	firstServiceIP = "10.96.0.1"
	// AdminUser is the user name in the control plane's admin certificate.
	AdminUser = "tether-admin"
)

// Runner starts commands and dials connections inside one network
// namespace. The hosts of a test topology implement it; HostRunner is the
// test process's own namespace.
type Runner interface {
	Command(ctx context.Context, name string, args ...string) *exec.Cmd
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// HostRunner runs commands and dials in the namespace of the test process.
type HostRunner struct{}

var _ Runner = HostRunner{}

// Command returns exec.CommandContext(ctx, name, args...).
func (HostRunner) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, name, args...)
}

// DialContext dials with a zero net.Dialer.
func (HostRunner) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// ControlPlaneOptions configures StartControlPlane.
type ControlPlaneOptions struct {
	// BindAddress is the IP the apiserver serves on and advertises;
	// default 127.0.0.1. etcd always listens on 127.0.0.1.
	BindAddress string
	// Runner starts etcd and the apiserver and dials the apiserver for the
	// returned clients. nil runs them in the test process's namespace
	// with ordinary clients.
	Runner Runner
	// ExtraAPIServerArgs are appended to the apiserver's flags (a flag
	// given twice takes its last value).
	ExtraAPIServerArgs []string
}

// ControlPlane is a running etcd and kube-apiserver. Everything it started
// and wrote is removed by the cleanup StartControlPlane registers.
type ControlPlane struct {
	// URL is the apiserver's base URL, https://<bind address>:<port>.
	URL string
	// EtcdURL is etcd's client URL, reachable from the Runner's namespace.
	EtcdURL string
	// CA signs the apiserver's serving certificate and is its client CA:
	// every certificate it issues is a valid apiserver identity.
	CA *CA
	// ServingCA verifies the apiserver's serving certificate.
	ServingCA *x509.CertPool
	// Admin and Client act as AdminUser in group system:masters.
	Admin  *rest.Config
	Client kubernetes.Interface
	// AdminKubeconfig is a kubeconfig file for the admin identity.
	AdminKubeconfig string
	// Dir holds the PKI files, the etcd data, kubeconfigs and the logs
	// etcd.log and kube-apiserver.log.
	Dir string

	runner Runner // HostRunner when the options gave none
	hostNS bool   // no Runner given: clients dial normally
}

// StartControlPlane starts etcd and kube-apiserver (from Binaries) and
// returns once /readyz answers ok. The apiserver authenticates client
// certificates of cp.CA and authorizes with Node,RBAC and NodeRestriction.
func StartControlPlane(t T, opts ControlPlaneOptions) *ControlPlane {
	t.Helper()
	bins := Binaries(t)
	start := time.Now()
	cp, err := newControlPlane(opts)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(cp.Dir) })

	ports, err := cp.freePorts("127.0.0.1", "127.0.0.1", opts.bindAddress())
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	etcdPeer := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	apiPort := ports[2]
	cp.EtcdURL = "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	cp.URL = "https://" + net.JoinHostPort(opts.bindAddress(), strconv.Itoa(apiPort))

	etcd := cp.start(t, bins.Etcd, "etcd", cp.etcdArgs(etcdPeer))
	cp.waitFor(t, etcd, "etcd", cp.etcdHealth)
	etcdReady := time.Since(start)

	args, err := cp.apiserverArgs(opts, apiPort)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	apiserver := cp.start(t, bins.KubeAPIServer, "kube-apiserver", args)
	cp.initAdmin(t)
	cp.waitFor(t, apiserver, "kube-apiserver", cp.readyz)
	t.Logf("control plane ready at %s in %v, etcd after %v (dir %s)", cp.URL,
		time.Since(start).Round(time.Millisecond), etcdReady.Round(time.Millisecond), cp.Dir)
	return cp
}

// bindAddress returns BindAddress, or 127.0.0.1 when it is empty.
func (o ControlPlaneOptions) bindAddress() string {
	if o.BindAddress == "" {
		return "127.0.0.1"
	}
	return o.BindAddress
}

func newControlPlane(opts ControlPlaneOptions) (*ControlPlane, error) {
	if net.ParseIP(opts.bindAddress()) == nil {
		return nil, fmt.Errorf("bind address %q is not an IP address", opts.BindAddress)
	}
	ca, err := NewCA("tether-testenv-ca")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tether-controlplane-")
	if err != nil {
		return nil, fmt.Errorf("create control plane dir: %w", err)
	}
	cp := &ControlPlane{CA: ca, ServingCA: ca.Pool(), Dir: dir, runner: opts.Runner}
	if cp.runner == nil {
		cp.runner, cp.hostNS = HostRunner{}, true
	}
	return cp, nil
}

func (cp *ControlPlane) etcdArgs(peerURL string) []string {
	return []string{
		"--name=testenv",
		"--data-dir=" + filepath.Join(cp.Dir, "etcd"),
		"--listen-client-urls=" + cp.EtcdURL,
		"--advertise-client-urls=" + cp.EtcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=testenv=" + peerURL,
		"--unsafe-no-fsync", // test data: speed over durability
		// One member has no peers to wait for: elect it in ~0.1 s, not ~1 s.
		"--heartbeat-interval=10",
		"--election-timeout=100",
	}
}

// apiserverArgs writes the apiserver's PKI files and returns its flags.
func (cp *ControlPlane) apiserverArgs(opts ControlPlaneOptions, port int) ([]string, error) {
	bind := opts.bindAddress()
	pki := filepath.Join(cp.Dir, "pki")
	if err := os.Mkdir(pki, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir: %w", err)
	}
	caFile, err := cp.CA.WriteFile(pki, "ca")
	if err != nil {
		return nil, err
	}
	serving, err := cp.CA.ServerCert("kube-apiserver", "127.0.0.1", "localhost", bind,
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", firstServiceIP)
	if err != nil {
		return nil, err
	}
	certFile, keyFile, err := serving.WriteFiles(pki, "serving")
	if err != nil {
		return nil, err
	}
	saPub, saKey, err := writeServiceAccountKey(pki)
	if err != nil {
		return nil, err
	}
	args := []string{
		"--etcd-servers=" + cp.EtcdURL,
		"--bind-address=" + bind,
		"--advertise-address=" + bind,
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(cp.Dir, "apiserver-certs"),
		"--tls-cert-file=" + certFile,
		"--tls-private-key-file=" + keyFile,
		"--client-ca-file=" + caFile,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saPub,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=" + serviceCIDR,
		"--allow-privileged=true",
		"--profiling=false",
	}
	if net.ParseIP(bind).IsLoopback() {
		// Endpoints may not hold loopback addresses: the "kubernetes"
		// Service gets no endpoints rather than invalid ones.
		args = append(args, "--endpoint-reconciler-type=none")
	}
	return append(args, opts.ExtraAPIServerArgs...), nil
}

// writeServiceAccountKey writes a fresh key for signing service account
// tokens as sa.key and its public half as sa.pub.
func writeServiceAccountKey(dir string) (pubFile, keyFile string, err error) {
	key, err := newKey()
	if err != nil {
		return "", "", err
	}
	keyPEM, err := MarshalKeyPEM(key)
	if err != nil {
		return "", "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return "", "", fmt.Errorf("marshal service account public key: %w", err)
	}
	pubFile, keyFile = filepath.Join(dir, "sa.pub"), filepath.Join(dir, "sa.key")
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("write service account key: %w", err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	if err := os.WriteFile(pubFile, pubPEM, 0o644); err != nil {
		return "", "", fmt.Errorf("write service account public key: %w", err)
	}
	return pubFile, keyFile, nil
}

// initAdmin sets up the admin identity: rest.Config, clientset, kubeconfig.
func (cp *ControlPlane) initAdmin(t T) {
	t.Helper()
	kp, err := cp.CA.ClientCert(AdminUser, "system:masters")
	if err != nil {
		t.Fatalf("admin certificate: %v", err)
	}
	cp.Admin = cp.RESTConfig(kp)
	cp.Client = cp.clientset(t, cp.Admin)
	cp.AdminKubeconfig = cp.Kubeconfig(t, AdminUser, kp)
}

// RESTConfig returns a client config that authenticates with kp and, when
// the control plane runs behind a Runner, dials through it.
func (cp *ControlPlane) RESTConfig(kp *KeyPair) *rest.Config {
	cfg := &rest.Config{
		Host: cp.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   cp.CA.CertPEM,
			CertData: kp.CertPEM,
			KeyData:  kp.KeyPEM,
		},
		QPS:   100,
		Burst: 200,
	}
	if !cp.hostNS {
		cfg.Dial = cp.runner.DialContext
	}
	return cfg
}

// Kubeconfig writes a kubeconfig file for user authenticating with kp and
// returns its path. A kubeconfig cannot carry the Runner: it is for
// processes that run where the apiserver's URL is reachable.
func (cp *ControlPlane) Kubeconfig(t T, user string, kp *KeyPair) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testenv"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.CA.CertPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.CertPEM, ClientKeyData: kp.KeyPEM}
	cfg.Contexts["testenv"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: user}
	cfg.CurrentContext = "testenv"
	name := strings.NewReplacer("/", "_", ":", "_").Replace(user) + ".kubeconfig"
	path := filepath.Join(cp.Dir, name)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatalf("write kubeconfig for %s: %v", user, err)
	}
	return path
}

// NodeClient issues a node certificate for node (with extraOrgs as further
// groups) and returns a clientset, its config and a kubeconfig file.
func (cp *ControlPlane) NodeClient(t T, node string, extraOrgs ...string) (kubernetes.Interface, *rest.Config, string) {
	t.Helper()
	kp, err := cp.CA.NodeCert(node, extraOrgs...)
	if err != nil {
		t.Fatalf("node certificate for %s: %v", node, err)
	}
	cfg := cp.RESTConfig(kp)
	return cp.clientset(t, cfg), cfg, cp.Kubeconfig(t, "system:node:"+node, kp)
}

func (cp *ControlPlane) clientset(t T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("create clientset for %s: %v", cfg.Host, err)
	}
	return c
}

// etcdHealth asks etcd's /health endpoint, which answers ok once etcd
// serves requests (its port accepts connections earlier).
func (cp *ControlPlane) etcdHealth(ctx context.Context) error {
	_, err := cp.probe(ctx, cp.EtcdURL+"/health", nil)
	return err
}

// probe GETs url through the Runner (verifying TLS with tlsConf, when
// given) and returns the body of a 200 answer, at most 64 KiB; any other
// status is an error that quotes the body.
func (cp *ControlPlane) probe(ctx context.Context, url string, tlsConf *tls.Config) ([]byte, error) {
	client := &http.Client{Transport: &http.Transport{DialContext: cp.runner.DialContext, TLSClientConfig: tlsConf}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(body))
	}
	return body, nil
}

// readyz asks the apiserver's /readyz as admin.
func (cp *ControlPlane) readyz(ctx context.Context) error {
	body, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(body))
	}
	return nil
}

// freePorts returns one free TCP port on each of hosts, all distinct. In
// the test process's namespace the kernel picks them; behind a Runner,
// whose namespace this process cannot bind in, a port counts as free when
// a connection to it is refused.
func (cp *ControlPlane) freePorts(hosts ...string) ([]int, error) {
	if cp.hostNS {
		return kernelPorts(hosts)
	}
	ports := make([]int, 0, len(hosts))
	for tries := 0; len(ports) < len(hosts); tries++ {
		if tries == 100 {
			return nil, fmt.Errorf("find free ports on %v: none after %d tries", hosts[len(ports)], tries)
		}
		// Below the usual ephemeral range (32768-60999), so that no
		// outgoing connection takes the port before the server does.
		port := 20000 + rand.IntN(12000)
		if !slices.Contains(ports, port) && cp.portFree(hosts[len(ports)], port) {
			ports = append(ports, port)
		}
	}
	return ports, nil
}

func (cp *ControlPlane) portFree(host string, port int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := cp.runner.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err == nil {
		conn.Close()
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// kernelPorts binds a listener on port 0 of each host, all at once so
// that the ports differ, and returns their ports after closing them.
func kernelPorts(hosts []string) ([]int, error) {
	var ports []int
	for _, host := range hosts {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("find free port on %s: %w", host, err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// component is a started etcd, apiserver or controller-manager process.
type component struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // exit status, set before done closes
}

// start runs bin in its own process group with its output in
// Dir/<name>.log, and registers a cleanup that stops it.
func (cp *ControlPlane) start(t T, bin, name string, args []string) *component {
	t.Helper()
	c := &component{name: name, log: filepath.Join(cp.Dir, name+".log"), done: make(chan struct{})}
	logFile, err := os.Create(c.log)
	if err != nil {
		t.Fatalf("create %s log: %v", name, err)
	}
	defer logFile.Close()
	ctx, cancel := context.WithCancel(context.Background())
	c.cmd = cp.runner.Command(ctx, bin, args...)
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	if c.cmd.SysProcAttr == nil {
		c.cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	c.cmd.SysProcAttr.Setpgid = true
	if err := c.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.stop()
		cancel()
		if f, ok := t.(interface{ Failed() bool }); ok && f.Failed() {
			t.Logf("%s", c.tail())
		}
	})
	return c
}

// stop sends SIGTERM to the component's process group and SIGKILL if it
// has not exited after componentStopGrace. A component that has exited is
// left alone, so stopping twice signals nothing the second time.
func (c *component) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	pgid := -c.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(componentStopGrace):
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-c.done
	}
}

// tail returns the last lines of the component's log, with a header.
func (c *component) tail() string {
	data, err := os.ReadFile(c.log)
	if err != nil {
		return fmt.Sprintf("--- %s log: %v", c.name, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return fmt.Sprintf("--- last %d lines of %s ---\n%s", len(lines), c.log, strings.Join(lines, "\n"))
}

// waitFor polls check until it succeeds, the component exits or
// readyTimeout passes; the latter two stop the test with the log tail.
func (cp *ControlPlane) waitFor(t T, c *component, what string, check func(context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := check(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-c.done:
			t.Fatalf("%s exited before it was ready: %v\n%s", what, c.err, c.tail())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after %v: %v\n%s", what, readyTimeout, err, c.tail())
		}
	}
}
