package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/keyutil"

	"github.com/tether-edge/tether/edgeproxy/identity/nodecert"
	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/version"
)

// The node client certificate that tether-edge obtains through the CSR API
// (--bootstrap-kubeconfig), as the kubelet does with its own: the same
// signer, subject and usages, so kube-controller-manager's csrapproving
// controller approves it with the RBAC a kubeadm cluster has.
const (
	// CertDir is where, under --data-dir, the certificate and its key are
	// kept: CertPairPrefix-<time>.pem files (mode 0600) and the symlink
	// CertPairPrefix-current.pem to the one in use, replaced by rename.
	CertDir        = "pki"
	CertPairPrefix = "tether-edge-client"
	// ClientSignerName is the signer the CSRs name, the kubelets' own:
	// kube-controller-manager signs with its cluster signing CA (the
	// apiservers' client CA) only node identities under it (exactly
	// O=system:nodes, no SANs), and csrapproving approves a request for
	// system:node:<name> from a bootstrap identity allowed to create
	// certificatesigningrequests/nodeclient, or from that node itself
	// (certificatesigningrequests/selfnodeclient).
	// kubernetes.io/kube-apiserver-client
	// is for other client identities: csrapproving does not know it, so
	// every request and renewal would wait for an operator's approval.
	ClientSignerName = certificatesv1.KubeAPIServerClientKubeletSignerName
)

// CertPath is the file of the certificate in use, under dataDir.
func CertPath(dataDir string) string {
	return filepath.Join(dataDir, CertDir, CertPairPrefix+"-current.pem")
}

// BootstrapOptions configure StartBootstrap.
type BootstrapOptions struct {
	Kubeconfig string // --bootstrap-kubeconfig
	NodeName   string // --node-name: the certificate is for system:node:<NodeName>
	DataDir    string // --data-dir: the certificate is kept in CertDir under it
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Bootstrap is the node's client certificate from the CSR API, renewed by
// package nodecert as the kubelet's certificate manager renews its own: a
// new ECDSA P-256 key and a CSR at a random point between 70 % and 90 % of
// the certificate's life, with the current certificate as the credentials
// (the bootstrap kubeconfig's only when there is none valid). Each new
// handshake presents the certificate of the moment; connections up keep
// going (see OnRenew).
type Bootstrap struct {
	node    string
	m       *nodecert.Manager
	metrics *metrics
	log     *slog.Logger
	done    chan struct{} // closed when the manager's Run returned
	halt    context.CancelFunc

	cur   atomic.Pointer[tls.Certificate]
	ready chan struct{} // closed once cur is set

	mu      sync.Mutex
	renewed []func() // called after each new certificate
}

// StartBootstrap starts the certificate manager for opts.NodeName and
// returns at once; Wait blocks until there is a certificate. A valid
// certificate for that node already in opts.DataDir is used without a
// request. The manager stops when ctx ends, or with Stop.
func StartBootstrap(ctx context.Context, opts BootstrapOptions) (*Bootstrap, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if _, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig); err != nil {
		return nil, fmt.Errorf("--bootstrap-kubeconfig: %w", err)
	}
	store, err := nodecert.NewStore(filepath.Join(opts.DataDir, CertDir), CertPairPrefix)
	if err != nil {
		return nil, fmt.Errorf("node client certificate: %w", err)
	}
	b := &Bootstrap{node: opts.NodeName, log: opts.Logger.With("cert", CertPath(opts.DataDir)), ready: make(chan struct{}), done: make(chan struct{})}
	if b.metrics, err = newMetrics(opts.Registerer, b.expiry); err != nil {
		return nil, err
	}
	cn := "system:node:" + opts.NodeName
	b.m, err = nodecert.New(nodecert.Config{
		Store: store,
		// A certificate for another node (--node-name changed), or one
		// that is no node identity, is replaced at once, and not used
		// meanwhile: no approver would renew it for this one.
		Accept: isNode(opts.NodeName),
		Client: func(current *tls.Certificate) (nodecert.CSRs, error) {
			kc, err := csrClient(opts.Kubeconfig, current)
			if err != nil {
				return nil, err
			}
			return kc.CertificateSigningRequests(), nil
		},
		Template: &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}}},
		// What csrapproving recognises as a node client certificate for
		// an ECDSA key: exactly these two usages.
		Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		SignerName: ClientSignerName,
		Issued:     func(cert *tls.Certificate) { b.set(cert, certIssued) },
		Failed:     func(error) { b.metrics.renewFailures.Inc() },
		Logger:     b.log,
	})
	if err != nil {
		return nil, fmt.Errorf("node client certificate: %w", err)
	}
	if cert := b.m.Current(); cert != nil {
		b.set(cert, certFromDataDir)
	} else {
		b.log.Info("requesting this node's client certificate through the CSR API; an approver (kube-controller-manager's csrapproving, or an operator: kubectl certificate approve) must approve it",
			"subject", "CN="+cn+",O=system:nodes", "signer", ClientSignerName)
	}
	ctx, b.halt = context.WithCancel(ctx)
	go func() {
		defer close(b.done)
		b.m.Run(ctx)
	}()
	return b, nil
}

// expiry is when the current certificate expires (Unix time), 0 before
// the first.
func (b *Bootstrap) expiry() float64 {
	if cert := b.cur.Load(); cert != nil {
		return float64(cert.Leaf.NotAfter.Unix())
	}
	return 0
}

// isNode accepts a certificate that names node (NodeName).
func isNode(node string) func(*tls.Certificate) bool {
	return func(cert *tls.Certificate) bool {
		name, err := NodeName(cert)
		return err == nil && name == node
	}
}

// Wait blocks until there is a certificate (true) or ctx ends.
func (b *Bootstrap) Wait(ctx context.Context) bool {
	select {
	case <-b.ready:
		return true
	case <-ctx.Done():
		return false
	}
}

// Stop stops the renewals and waits for the manager to end.
func (b *Bootstrap) Stop() {
	b.halt()
	<-b.done
}

// GetClientCertificate is for tls.Config.GetClientCertificate: the
// certificate of the moment, even expired (the peer says why it refuses
// it; the manager is renewing it meanwhile).
func (b *Bootstrap) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if cert := b.cur.Load(); cert != nil {
		return cert, nil
	}
	return nil, errors.New("no client certificate yet: the CSR is not approved and signed")
}

// NodeName is the node the certificate is for.
func (b *Bootstrap) NodeName() string { return b.node }

// OnRenew has f called after each new certificate, once new handshakes
// present it.
func (b *Bootstrap) OnRenew(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.renewed = append(b.renewed, f)
}

// certOrigin is where a node client certificate came from.
type certOrigin uint8

const (
	certFromDataDir certOrigin = iota // kept from an earlier issue
	certIssued                        // just issued through the CSR API
)

// set makes cert, from origin, the one new handshakes present.
func (b *Bootstrap) set(cert *tls.Certificate, origin certOrigin) {
	first := b.cur.Swap(cert) == nil
	if first {
		close(b.ready)
	}
	msg := "node client certificate from --data-dir"
	if origin == certIssued {
		msg = "node client certificate issued; new connections present it"
	}
	l := cert.Leaf
	b.log.Info(msg, "subject", l.Subject.String(), "serial", l.SerialNumber.String(), "not_before", l.NotBefore, "not_after", l.NotAfter)
	if first {
		return
	}
	b.mu.Lock()
	fs := append([]func(){}, b.renewed...)
	b.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// csrClient is the client that requests certificates: with the current
// certificate while there is a valid one, else with the bootstrap
// kubeconfig's credentials. The kubeconfig is read at each request, so
// that a new bootstrap token in it is used without a restart; its server
// and CA are used either way.
func csrClient(bootstrapKubeconfig string, current *tls.Certificate) (*kube.Client, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", bootstrapKubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--bootstrap-kubeconfig: %w", err)
	}
	if current != nil {
		certPEM, keyPEM, err := encodePair(current)
		if err != nil {
			return nil, err
		}
		rc = rest.AnonymousClientConfig(rc)
		rc.CertData, rc.KeyData = certPEM, keyPEM
	}
	rc.UserAgent = "tether-edge/" + version.Version
	return kube.NewForConfig(rc)
}

// encodePair is cert and its key as PEM.
func encodePair(cert *tls.Certificate) (certPEM, keyPEM []byte, err error) {
	for _, der := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	if keyPEM, err = keyutil.MarshalPrivateKeyToPEM(cert.PrivateKey); err != nil {
		return nil, nil, fmt.Errorf("node client key: %w", err)
	}
	return certPEM, keyPEM, nil
}
