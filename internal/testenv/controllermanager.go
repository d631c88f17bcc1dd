package testenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const (
	// ControllerManagerUser is the user name in kube-controller-manager's
	// certificate; the apiserver's bootstrap RBAC binds it to the
	// system:kube-controller-manager ClusterRole.
	ControllerManagerUser = "system:kube-controller-manager"
	// NodeLifecycleController is kube-controller-manager's name for the
	// controller that turns a node's Ready condition Unknown when neither
	// its Lease nor its status has been renewed for the grace period, and
	// taints it node.kubernetes.io/unreachable.
	NodeLifecycleController = "node-lifecycle-controller"
	// CSRApprovingController approves node client CSRs (signer
	// kubernetes.io/kube-apiserver-client-kubelet) whose requester may
	// create certificatesigningrequests/nodeclient (a bootstrap identity)
	// or, for its own node, certificatesigningrequests/selfnodeclient.
	CSRApprovingController = "certificatesigningrequest-approving-controller"
	// CSRSigningController signs approved CSRs of the kubernetes.io
	// signers; see ControllerManagerOptions.SignWithCA.
	CSRSigningController = "certificatesigningrequest-signing-controller"
)

// ControllerManagerOptions configures StartControllerManager. The zero
// value runs the node lifecycle controller with periods short enough for
// tests.
type ControllerManagerOptions struct {
	// Controllers are the controllers to run, by the full names that
	// `kube-controller-manager --help` lists under --controllers (aliases
	// are not waited for). Default: NodeLifecycleController alone.
	Controllers []string
	// NodeMonitorGracePeriod is how long a node may go without renewing
	// its Lease or posting its Ready condition before the controller sets
	// Ready=Unknown. Default 8s (kube-controller-manager's own: 50s).
	NodeMonitorGracePeriod time.Duration
	// NodeMonitorPeriod is how often the controller checks every node.
	// Default 1s.
	NodeMonitorPeriod time.Duration
	// NodeStartupGracePeriod replaces NodeMonitorGracePeriod for a node
	// that never posted a Ready condition. Default NodeMonitorGracePeriod.
	NodeStartupGracePeriod time.Duration
	// SignWithCA gives the CSR signing controller the control plane's CA
	// (the apiserver's client CA) as its cluster signing CA, so that the
	// client certificates it signs authenticate with the apiserver.
	// Without it the controller signs nothing.
	SignWithCA bool
	// ClusterSigningDuration is the life of the certificates it signs
	// (--cluster-signing-duration; default one year). Those shorter than
	// 8 h end that long after signing; all start 5 minutes before it.
	ClusterSigningDuration time.Duration
	// ExtraArgs are appended to the flags (a flag given twice takes its
	// last value).
	ExtraArgs []string
}

// withDefaults returns o with its zero fields set to the defaults above.
func (o ControllerManagerOptions) withDefaults() ControllerManagerOptions {
	if len(o.Controllers) == 0 {
		o.Controllers = []string{NodeLifecycleController}
	}
	if o.NodeMonitorGracePeriod == 0 {
		o.NodeMonitorGracePeriod = 8 * time.Second
	}
	if o.NodeMonitorPeriod == 0 {
		o.NodeMonitorPeriod = time.Second
	}
	if o.NodeStartupGracePeriod == 0 {
		o.NodeStartupGracePeriod = o.NodeMonitorGracePeriod
	}
	return o
}

// ControllerManager is a running kube-controller-manager.
type ControllerManager struct {
	// Options are the options it runs with, defaults filled in.
	Options ControllerManagerOptions
	// Log is its log file, Dir/kube-controller-manager.log of the
	// control plane.
	Log string
	// HealthzURL is its /healthz on its secure port, served with a
	// certificate of the control plane's CA.
	HealthzURL string

	c *component
}

// StartControllerManager starts kube-controller-manager (from Binaries)
// against the control plane, through its Runner, and returns once every
// controller in opts.Controllers answers its /healthz check. It
// authenticates as ControllerManagerUser and, as in a kubeadm cluster, runs
// each controller with its own service account
// (--use-service-account-credentials): the node lifecycle controller acts
// as kube-system/node-controller with the RBAC the apiserver bootstraps.
// Leader election is off. The registered cleanup stops it.
func (cp *ControlPlane) StartControllerManager(t T, opts ControllerManagerOptions) *ControllerManager {
	t.Helper()
	bins := Binaries(t)
	start := time.Now()
	opts = opts.withDefaults()
	ports, err := cp.freePorts("127.0.0.1")
	if err != nil {
		t.Fatalf("start kube-controller-manager: %v", err)
	}
	args, err := cp.controllerManagerArgs(t, opts, ports[0])
	if err != nil {
		t.Fatalf("start kube-controller-manager: %v", err)
	}
	cm := &ControllerManager{
		Options:    opts,
		HealthzURL: "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])) + "/healthz",
	}
	cm.c = cp.start(t, bins.KubeControllerManager, "kube-controller-manager", args)
	cm.Log = cm.c.log
	cp.waitFor(t, cm.c, "kube-controller-manager", func(ctx context.Context) error {
		return cp.controllersHealthy(ctx, cm)
	})
	t.Logf("kube-controller-manager running %s in %v (grace %v, period %v)", strings.Join(opts.Controllers, ","),
		time.Since(start).Round(time.Millisecond), opts.NodeMonitorGracePeriod, opts.NodeMonitorPeriod)
	return cm
}

// Stop stops kube-controller-manager before the test's cleanup does, for a
// test that needs the controllers gone. Stopping twice is harmless.
func (cm *ControllerManager) Stop() { cm.c.stop() }

// controllerManagerArgs writes kube-controller-manager's kubeconfig and
// serving certificate and returns its flags.
func (cp *ControlPlane) controllerManagerArgs(t T, opts ControllerManagerOptions, port int) ([]string, error) {
	kp, err := cp.CA.ClientCert(ControllerManagerUser)
	if err != nil {
		return nil, err
	}
	kubeconfig := cp.Kubeconfig(t, ControllerManagerUser, kp)
	serving, err := cp.CA.ServerCert("kube-controller-manager", "127.0.0.1", "localhost")
	if err != nil {
		return nil, err
	}
	certFile, keyFile, err := serving.WriteFiles(filepath.Join(cp.Dir, "pki"), "kube-controller-manager")
	if err != nil {
		return nil, err
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + strings.Join(opts.Controllers, ","),
		"--use-service-account-credentials=true",
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + certFile,
		"--tls-private-key-file=" + keyFile,
		"--node-monitor-grace-period=" + opts.NodeMonitorGracePeriod.String(),
		"--node-monitor-period=" + opts.NodeMonitorPeriod.String(),
		"--node-startup-grace-period=" + opts.NodeStartupGracePeriod.String(),
		"--profiling=false",
	}
	if opts.SignWithCA {
		signing, err := cp.writeSigningCA()
		if err != nil {
			return nil, err
		}
		args = append(args, signing...)
	}
	if opts.ClusterSigningDuration > 0 {
		args = append(args, "--cluster-signing-duration="+opts.ClusterSigningDuration.String())
	}
	return append(args, opts.ExtraArgs...), nil
}

// writeSigningCA writes the control plane's CA key (mode 0600) beside its
// certificate and returns the flags that make it the cluster signing CA.
func (cp *ControlPlane) writeSigningCA() ([]string, error) {
	keyPEM, err := MarshalKeyPEM(cp.CA.Key)
	if err != nil {
		return nil, err
	}
	keyFile := filepath.Join(cp.Dir, "pki", "ca.key")
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("write signing CA key: %w", err)
	}
	return []string{
		"--cluster-signing-cert-file=" + filepath.Join(cp.Dir, "pki", "ca.crt"),
		"--cluster-signing-key-file=" + keyFile,
	}, nil
}

// controllersHealthy asks /healthz?verbose, which lists one check per
// controller once the controllers have been built and are about to run
// (kube-controller-manager serves no /healthz/<name> paths), and wants
// "[+]<name> ok" for every controller in cm.Options.Controllers.
func (cp *ControlPlane) controllersHealthy(ctx context.Context, cm *ControllerManager) error {
	body, err := cp.probe(ctx, cm.HealthzURL+"?verbose", &tls.Config{RootCAs: cp.ServingCA})
	if err != nil {
		return err
	}
	for _, name := range cm.Options.Controllers {
		if name == "*" || strings.HasPrefix(name, "-") {
			continue
		}
		if !bytes.Contains(body, []byte("[+]"+name+" ok")) {
			return fmt.Errorf("no check of %s yet: %s", name, bytes.TrimSpace(body))
		}
	}
	return nil
}
