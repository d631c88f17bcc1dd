// Package identity is who this edge node is to the gateways, the
// apiservers and its pool's peers: the node name and the client
// certificate that proves it. It answers, in one place, which certificate
// the tunnel, the apiserver proxy and the pool listener present: one
// obtained through the CSR API with --bootstrap-kubeconfig (bootstrap.go,
// renewed by package nodecert), one in --cert and --key or in the
// --kubeconfig's files (read again when they change, package
// internal/certfile), or one inline in the kubeconfig (fixed). See
// README.md.
package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/certfile"
	"github.com/tether-edge/tether/tunnel"
)

// Options are the settings that say who the node is, in terms of
// tether-edge's flags.
type Options struct {
	NodeName string // --node-name; "" to take the certificates'
	// Cert and Key are --cert and --key (the tunnel's certificate, and
	// the apiserver proxy's with --server-addr).
	Cert, Key string
	// Kubeconfig (--kubeconfig) holds the apiserver proxy's credentials;
	// BootstrapKubeconfig (--bootstrap-kubeconfig) has the certificate
	// obtained through the CSR API and kept under DataDir.
	Kubeconfig          string
	BootstrapKubeconfig string
	DataDir             string
	// ServerAddr (--server-addr) replaces the kubeconfig's server,
	// ServerCA (--server-ca) its CA.
	ServerAddr []string
	ServerCA   string

	Logger     *slog.Logger // nil: slog.Default()
	Registerer prometheus.Registerer
}

// Identity is the node name and the client certificates that prove it.
// Run makes it once and hands it to the parts; a certificate in files is
// read and watched once however many parts present it (--cert for the
// tunnel and the same file in --kubeconfig for the proxy).
//
// The node name is --node-name, else the one the tunnel's certificate
// names, else the one of the apiserver proxy's; every certificate is read
// by tunnel.NodeName (CN=system:node:<name> and O=system:nodes), as the
// gateway and the pool's peers read it.
type Identity struct {
	opts Options
	name string     // "" while unknown
	boot *Bootstrap // nil: the certificates are in files
	log  *slog.Logger

	mu    sync.Mutex
	pairs map[[2]string]*Cert // by certificate and key file
}

// Start makes the node's identity. With --bootstrap-kubeconfig it starts
// obtaining and renewing the certificate (Bootstrap) and returns at once;
// Wait blocks until there is one. The renewals stop when ctx ends, or
// with Stop.
func Start(ctx context.Context, opts Options) (*Identity, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	id := &Identity{opts: opts, name: opts.NodeName, log: opts.Logger, pairs: map[[2]string]*Cert{}}
	if opts.BootstrapKubeconfig != "" {
		var err error
		id.boot, err = StartBootstrap(ctx, BootstrapOptions{Kubeconfig: opts.BootstrapKubeconfig, NodeName: opts.NodeName,
			DataDir: opts.DataDir, Registerer: opts.Registerer, Logger: opts.Logger.With("node", opts.NodeName)})
		if err != nil {
			return nil, err
		}
	}
	return id, nil
}

// Wait blocks until the node has a certificate (true) or ctx ends: at
// once unless the certificate is obtained through the CSR API.
func (id *Identity) Wait(ctx context.Context) bool {
	return id.boot == nil || id.boot.Wait(ctx)
}

// Stop stops the renewals, if any, and waits for them to end.
func (id *Identity) Stop() {
	if id.boot != nil {
		id.boot.Stop()
	}
}

// Name is the node name; "" if neither --node-name nor a certificate
// gave one.
func (id *Identity) Name() string {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.name
}

// learn takes node as the node name if none is known yet.
func (id *Identity) learn(node string) {
	id.mu.Lock()
	defer id.mu.Unlock()
	if id.name == "" {
		id.name = node
	}
}

// Tunnel is the certificate the tunnel presents to the gateways: the one
// obtained with --bootstrap-kubeconfig, or the one in --cert and --key,
// which must name a node. The identity learns that node's name if it
// knows none yet.
func (id *Identity) Tunnel() (*Cert, error) {
	cert := id.bootstrapped()
	if cert == nil {
		var err error
		if cert, err = id.files(id.opts.Cert, id.opts.Key); err != nil {
			return nil, err
		}
	}
	certNode, err := cert.NodeName()
	if err != nil {
		return nil, fmt.Errorf("--cert %s cannot register with a gateway: %w", id.opts.Cert, err)
	}
	if id.opts.NodeName != "" && id.opts.NodeName != certNode {
		id.log.Warn("--node-name differs from the node the client certificate names; the gateway knows this edge by its certificate",
			"node_name", id.opts.NodeName, "cert_node", certNode)
	}
	id.learn(certNode)
	return cert, nil
}

// files is the client certificate in certPath and keyPath, loaded on the
// first call.
func (id *Identity) files(certPath, keyPath string) (*Cert, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	k := [2]string{certPath, keyPath}
	if c, ok := id.pairs[k]; ok {
		return c, nil
	}
	kp, err := certfile.LoadKeyPair(certPath, keyPath, certfile.Options{Name: "client certificate " + certPath, Logger: id.log})
	if err != nil {
		return nil, err
	}
	c := &Cert{files: kp}
	id.pairs[k] = c
	return c, nil
}

// bootstrapped is the certificate obtained with --bootstrap-kubeconfig;
// nil without.
func (id *Identity) bootstrapped() *Cert {
	if id.boot == nil {
		return nil
	}
	return &Cert{boot: id.boot}
}

// Watch checks the certificate files every interval until ctx ends, each
// pair once, and tells their users of a rotation (Cert.OnRotate). A
// certificate from the CSR API needs no watching: its renewals tell them.
func (id *Identity) Watch(ctx context.Context, interval time.Duration) {
	id.mu.Lock()
	var wg sync.WaitGroup
	for _, c := range id.pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.files.Watch(ctx, interval, c.rotated)
		}()
	}
	id.mu.Unlock()
	wg.Wait()
}

// Cert is one client certificate of the node: in files (watched), from
// the CSR API (renewed by Bootstrap), or fixed.
type Cert struct {
	files *certfile.KeyPair
	boot  *Bootstrap
	fixed *tls.Certificate

	mu    sync.Mutex
	users []rotationUser
}

type rotationUser struct {
	msg string // logged when the files change
	f   func()
	log *slog.Logger
}

// fixed is a certificate that never changes (a kubeconfig's
// client-certificate-data).
func fixed(cert tls.Certificate) *Cert { return &Cert{fixed: &cert} }

// GetClientCertificate is for tls.Config.GetClientCertificate: the
// certificate of the moment.
func (c *Cert) GetClientCertificate(i *tls.CertificateRequestInfo) (*tls.Certificate, error) {
	switch {
	case c.files != nil:
		return c.files.GetClientCertificate(i)
	case c.boot != nil:
		return c.boot.GetClientCertificate(i)
	}
	return c.fixed, nil
}

// NodeName is the node the certificate names (tunnel.NodeName).
func (c *Cert) NodeName() (string, error) {
	if c.boot != nil {
		return c.boot.NodeName(), nil
	}
	cert, err := c.GetClientCertificate(nil)
	if err != nil {
		return "", err
	}
	return NodeName(cert)
}

// OnRotate has f called after each new certificate, once new handshakes
// present it: for files, msg is logged first (on log).
func (c *Cert) OnRotate(msg string, log *slog.Logger, f func()) {
	switch {
	case c.boot != nil:
		c.boot.OnRenew(f)
	case c.files != nil:
		c.mu.Lock()
		c.users = append(c.users, rotationUser{msg: msg, f: f, log: log})
		c.mu.Unlock()
	}
}

func (c *Cert) rotated(cert *tls.Certificate) {
	c.mu.Lock()
	users := append([]rotationUser(nil), c.users...)
	c.mu.Unlock()
	for _, u := range users {
		u.log.Info(u.msg, "not_after", cert.Leaf.NotAfter)
		u.f()
	}
}

// NodeName is tunnel.NodeName of a key pair's leaf: the node it names
// (CN=system:node:<name>, O=system:nodes), as the gateway and the pool's
// peers read it.
func NodeName(cert *tls.Certificate) (string, error) {
	leaf := cert.Leaf
	if leaf == nil {
		if len(cert.Certificate) == 0 {
			return "", errors.New("no certificate")
		}
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return "", fmt.Errorf("client certificate: %w", err)
		}
	}
	return tunnel.NodeName(leaf)
}
