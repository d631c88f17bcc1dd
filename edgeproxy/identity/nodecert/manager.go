// Package nodecert obtains and renews a node's client certificate through
// the Kubernetes CSR API, as the kubelet's certificate manager does: a new
// ECDSA P-256 key and a CertificateSigningRequest at a random point between
// 70 % and 90 % of the certificate's life, signed once an approver approves
// it; the pair is kept in a Store.
//
// It replaces client-go's k8s.io/client-go/util/certificate in tether-edge,
// which needs the whole clientset (see internal/kube for why the edge does
// without it). The behaviour is that manager's: the same rotation point, the
// same CSR, a renewal asked with the current certificate while it is
// valid, retries after 2, 4, 8, 16 s and then every 32 s, at most one
// certificate a second, a wait of at most 15 minutes for each request's
// decision. The Store keeps client-go's file layout.
package nodecert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// CSRs is the part of the CSR API a Manager uses (kube.Client's
// CertificateSigningRequests()).
type CSRs interface {
	Create(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, opts metav1.CreateOptions) (*certificatesv1.CertificateSigningRequest, error)
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*certificatesv1.CertificateSigningRequest, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Config configures a Manager.
type Config struct {
	Store *Store
	// Template is the subject of each request.
	Template   *x509.CertificateRequest
	Usages     []certificatesv1.KeyUsage
	SignerName string
	// Client returns the CSR API to request with, authenticated with
	// current (nil when there is no valid certificate: the bootstrap
	// credentials then). It is called for each request.
	Client func(current *tls.Certificate) (CSRs, error)
	// Accept says whether a stored certificate is one to keep (nil: any).
	// One it refuses is replaced at once and not offered meanwhile.
	Accept func(*tls.Certificate) bool
	// Issued is called with each new certificate once stored.
	Issued func(*tls.Certificate)
	// Failed is called with each failed attempt.
	Failed func(error)
	Logger *slog.Logger
}

// The waits of client-go's certificate manager.
const (
	decisionTimeout = 15 * time.Minute
	firstRetry      = 2 * time.Second
	maxRetry        = 32 * time.Second
	minInterval     = time.Second
)

// Manager keeps a valid certificate in its Store.
type Manager struct {
	c   Config
	now func() time.Time

	mu   sync.Mutex
	cert *tls.Certificate
}

// New returns a Manager; the Store's certificate, if any and accepted, is
// its first.
func New(c Config) (*Manager, error) {
	if c.Store == nil || c.Template == nil || c.Client == nil || c.SignerName == "" {
		return nil, errors.New("node certificate: Store, Template, Client and SignerName are required")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Manager{c: c, now: time.Now}
	cert, err := c.Store.Current()
	switch {
	case errors.Is(err, ErrNoCertificate):
	case err != nil:
		// An unreadable file is replaced by the next certificate.
		c.Logger.Warn("node certificate: stored certificate unreadable; requesting a new one", "err", err)
	case c.Accept == nil || c.Accept(cert):
		m.cert = cert
	}
	return m, nil
}

// Current is the certificate in use, nil if there is none or it expired.
func (m *Manager) Current() *tls.Certificate {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cert == nil || m.now().After(m.cert.Leaf.NotAfter) {
		return nil
	}
	return m.cert
}

// Run renews the certificate until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	for ctx.Err() == nil {
		if !sleep(ctx, m.rotationDeadline().Sub(m.now())) {
			return
		}
		// At most one certificate a second, whatever its life.
		next := m.now().Add(minInterval)
		retry := firstRetry
		for {
			err := m.rotate(ctx)
			if err == nil || ctx.Err() != nil {
				break
			}
			m.c.Logger.Warn("node certificate not obtained; retrying", "in", retry, "err", err)
			if m.c.Failed != nil {
				m.c.Failed(err)
			}
			if !sleep(ctx, jitter(retry)) {
				return
			}
			retry = min(2*retry, maxRetry)
		}
		if !sleep(ctx, next.Sub(m.now())) {
			return
		}
	}
}

// rotationDeadline is when to renew: a random point between 70 % and 90 %
// of the certificate's life; now when there is none.
func (m *Manager) rotationDeadline() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cert == nil {
		return m.now()
	}
	return RotationDeadline(m.cert.Leaf.NotBefore, m.cert.Leaf.NotAfter, mathrand.Float64())
}

// RotationDeadline is the point at 70 % + 20 % × r of the life from
// notBefore to notAfter (r in [0, 1)).
func RotationDeadline(notBefore, notAfter time.Time, r float64) time.Time {
	life := float64(notAfter.Sub(notBefore))
	return notBefore.Add(time.Duration(life * (0.7 + 0.2*r)))
}

// rotate requests a certificate for a new key, waits for it and stores it.
func (m *Manager) rotate(ctx context.Context) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("new key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, m.c.Template, key)
	if err != nil {
		return fmt.Errorf("certificate request: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("new key: %w", err)
	}
	api, err := m.c.Client(m.Current())
	if err != nil {
		return err
	}
	csr, err := api.Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "csr-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: m.c.SignerName,
			Usages:     m.c.Usages,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create CSR: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, decisionTimeout)
	defer cancel()
	certPEM, err := waitSigned(wctx, api, csr)
	if err != nil {
		return fmt.Errorf("CSR %s: %w", csr.Name, err)
	}
	// The store refuses a certificate that is not for the key.
	cert, err := m.c.Store.Update(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		return fmt.Errorf("CSR %s: %w", csr.Name, err)
	}
	m.mu.Lock()
	m.cert = cert
	m.mu.Unlock()
	if m.c.Issued != nil {
		m.c.Issued(cert)
	}
	return nil
}

// waitSigned waits until csr is approved and signed (its certificate),
// denied or failed (an error), or ctx ends. When a watch fails or ends
// without a decision (it expired, the apiserver went away), the request is
// read again after firstRetry and watched on.
func waitSigned(ctx context.Context, api CSRs, csr *certificatesv1.CertificateSigningRequest) ([]byte, error) {
	var err error
	for {
		if done, cert, err := decided(csr); done {
			return cert, err
		}
		if csr, err = watchDecision(ctx, api, csr); err != nil {
			return nil, err
		}
		if isDecided(csr) {
			continue
		}
		if !sleep(ctx, firstRetry) {
			return nil, fmt.Errorf("no decision: %w", ctx.Err())
		}
		if csr, err = getSame(ctx, api, csr); err != nil {
			return nil, err
		}
	}
}

// watchDecision watches csr until it is decided or the watch fails or
// ends; it returns csr as last seen.
func watchDecision(ctx context.Context, api CSRs, csr *certificatesv1.CertificateSigningRequest) (*certificatesv1.CertificateSigningRequest, error) {
	w, err := api.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", csr.Name).String(),
		ResourceVersion: csr.ResourceVersion})
	if err != nil {
		return csr, nil // read again and retried by the caller
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		c, ok := ev.Object.(*certificatesv1.CertificateSigningRequest)
		if !ok || c.UID != csr.UID {
			continue
		}
		if ev.Type == watch.Deleted {
			return nil, errors.New("deleted before a decision")
		}
		if csr = c; isDecided(csr) {
			break
		}
	}
	return csr, nil
}

func isDecided(csr *certificatesv1.CertificateSigningRequest) bool {
	done, _, _ := decided(csr)
	return done
}

// getSame reads csr again; it must still be the same request.
func getSame(ctx context.Context, api CSRs, csr *certificatesv1.CertificateSigningRequest) (*certificatesv1.CertificateSigningRequest, error) {
	c, err := api.Get(ctx, csr.Name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, errors.New("deleted before a decision")
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("no decision: %w", ctx.Err())
		}
		return csr, nil // try the watch again
	}
	if c.UID != csr.UID {
		return nil, errors.New("deleted and replaced by another request")
	}
	return c, nil
}

// decided reports whether csr is signed, denied or failed.
func decided(csr *certificatesv1.CertificateSigningRequest) (bool, []byte, error) {
	approved := false
	for _, c := range csr.Status.Conditions {
		if c.Status == corev1.ConditionFalse {
			continue
		}
		switch c.Type {
		case certificatesv1.CertificateDenied:
			return true, nil, fmt.Errorf("denied: %s %s", c.Reason, c.Message)
		case certificatesv1.CertificateFailed:
			return true, nil, fmt.Errorf("failed: %s %s", c.Reason, c.Message)
		case certificatesv1.CertificateApproved:
			approved = true
		}
	}
	if approved && len(csr.Status.Certificate) > 0 {
		return true, csr.Status.Certificate, nil
	}
	return false, nil, nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// jitter is d plus up to 10 %.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration(mathrand.Int64N(int64(d)/10+1))
}
