package edgeproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/tunnel"
)

// identity is who this edge is to the gateways, the apiservers and its
// pool's peers: the node name and the client certificates that prove it.
// Run makes it once and hands it to the parts; a certificate in files is
// read and watched once however many parts present it (--cert for the
// tunnel and the same file in --kubeconfig for the proxy).
//
// The node name is --node-name, else the one the tunnel's certificate
// names, else the one of the apiserver proxy's; every certificate is read
// by tunnel.NodeName (CN=system:node:<name> and O=system:nodes), as the
// gateway and the pool's peers read it.
type identity struct {
	name string // "" while unknown
	nc   *nodeCert
	log  *slog.Logger

	mu    sync.Mutex
	pairs map[[2]string]*clientCert // by certificate and key file
}

func newIdentity(cfg Config, nc *nodeCert, log *slog.Logger) *identity {
	return &identity{name: cfg.NodeName, nc: nc, log: log, pairs: map[[2]string]*clientCert{}}
}

// files is the client certificate in certPath and keyPath, loaded on the
// first call.
func (id *identity) files(certPath, keyPath string) (*clientCert, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	k := [2]string{certPath, keyPath}
	if c, ok := id.pairs[k]; ok {
		return c, nil
	}
	f, err := edgetunnel.LoadCertFiles(certPath, keyPath, id.log)
	if err != nil {
		return nil, err
	}
	c := &clientCert{files: f}
	id.pairs[k] = c
	return c, nil
}

// bootstrapped is the certificate obtained with --bootstrap-kubeconfig.
func (id *identity) bootstrapped() *clientCert { return &clientCert{nc: id.nc} }

// fixed is a certificate that never changes (a kubeconfig's
// client-certificate-data).
func fixed(cert tls.Certificate) *clientCert { return &clientCert{fixed: &cert} }

// learn takes node as the node name if none is known yet.
func (id *identity) learn(node string) {
	if id.name == "" {
		id.name = node
	}
}

// Name is the node name; "" if neither --node-name nor a certificate
// gave one.
func (id *identity) Name() string { return id.name }

// Watch checks the certificate files every interval until ctx ends, each
// pair once, and tells their users of a rotation.
func (id *identity) Watch(ctx context.Context, interval time.Duration) {
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

// clientCert is one client certificate of the node: in files (watched),
// from the CSR API (renewed by nodeCert), or fixed.
type clientCert struct {
	files *edgetunnel.CertFiles
	nc    *nodeCert
	fixed *tls.Certificate

	mu    sync.Mutex
	users []rotationUser
}

type rotationUser struct {
	msg string // logged when the files change
	f   func()
	log *slog.Logger
}

// GetClientCertificate is for tls.Config.GetClientCertificate.
func (c *clientCert) GetClientCertificate(i *tls.CertificateRequestInfo) (*tls.Certificate, error) {
	switch {
	case c.files != nil:
		return c.files.GetClientCertificate(i)
	case c.nc != nil:
		return c.nc.GetClientCertificate(i)
	}
	return c.fixed, nil
}

// NodeName is the node the certificate names (tunnel.NodeName).
func (c *clientCert) NodeName() (string, error) {
	if c.nc != nil {
		return c.nc.NodeName(), nil
	}
	cert, err := c.GetClientCertificate(nil)
	if err != nil {
		return "", err
	}
	return leafNodeName(cert)
}

// leafNodeName is tunnel.NodeName of a key pair's leaf.
func leafNodeName(cert *tls.Certificate) (string, error) {
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

// onRotate has f called after each new certificate, once new handshakes
// present it: for files, msg is logged first.
func (c *clientCert) onRotate(msg string, log *slog.Logger, f func()) {
	switch {
	case c.nc != nil:
		c.nc.onRenew(f)
	case c.files != nil:
		c.mu.Lock()
		c.users = append(c.users, rotationUser{msg: msg, f: f, log: log})
		c.mu.Unlock()
	}
}

func (c *clientCert) rotated(cert *tls.Certificate) {
	c.mu.Lock()
	users := append([]rotationUser(nil), c.users...)
	c.mu.Unlock()
	for _, u := range users {
		u.log.Info(u.msg, "not_after", cert.Leaf.NotAfter)
		u.f()
	}
}
