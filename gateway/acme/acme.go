// Package acme is the gateway's ACME mode (--acme-domain): certmagic
// obtains the serving certificate of the QUIC listener from an ACME CA
// (Let's Encrypt by default) and renews it, and the tunnel server's
// handshakes take it from certmagic's cache (Manager.GetCertificate), so a
// renewal reaches new handshakes at once and leaves the tunnels up.
//
// Challenges are HTTP-01 only: the ACME server fetches
// http://<domain>/.well-known/acme-challenge/<token> on TCP port 80 of the
// domain's address, which the gateway serves on --acme-http-listen
// (Manager.HTTPHandler). The handler answers from the storage, so with
// shared storage (gateway/acmestore) any replica answers a challenge that
// another replica started. TLS-ALPN-01 would need a TCP TLS listener on
// 443, which the gateway does not have; DNS-01 needs a DNS provider's API.
//
// Everything certmagic keeps — the ACME account and its key, the
// certificates and their keys, challenge tokens, locks — is in
// Options.Storage: a directory (certmagic.FileStorage) or a Kubernetes
// Secret that replicas share. certmagic takes a storage lock around
// account registration, issuance and renewal and looks in the storage
// again once it holds it, so replicas sharing the storage register one
// account and obtain one certificate per name.
package acme

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"github.com/caddyserver/certmagic"
)

// ResetKeyStorageKey is where the seed of the QUIC stateless reset key is
// kept in the storage (see Manager.ResetKey).
const ResetKeyStorageKey = "tether/quic-stateless-reset.key"

// Options configure New.
type Options struct {
	// Domains are the names the certificate is for (what edges dial).
	// Each name gets a certificate of its own; a handshake without SNI
	// gets the first name's.
	Domains []string
	// CA is the ACME directory URL; empty means Let's Encrypt's
	// production directory (certmagic.LetsEncryptProductionCA).
	CA string
	// Email is the ACME account's contact; may be empty.
	Email string
	// CARoots verify the ACME server's own HTTPS; nil means the system
	// roots.
	CARoots *x509.CertPool
	// Storage holds the account, the certificates and the locks.
	Storage certmagic.Storage
	// HTTPHost and HTTPPort are the address of the challenge listener
	// the caller serves HTTPHandler on (the ACME server must reach it as
	// <domain>:80). certmagic, finding it bound, starts no listener of its
	// own.
	HTTPHost string
	HTTPPort int
	// RenewCheckInterval is how often certificates are checked for
	// renewal; 0 means certmagic's default (10 minutes).
	RenewCheckInterval time.Duration
	// RenewalWindowRatio is the part of a certificate's life left when it
	// is renewed (unless the CA's renewal information says otherwise); 0
	// means certmagic's default (1/3).
	RenewalWindowRatio float64
	// Logger; nil discards.
	Logger *slog.Logger
}

// Manager obtains and renews the certificates of Options.Domains.
type Manager struct {
	opts   Options
	log    *slog.Logger
	cache  *certmagic.Cache
	cfg    *certmagic.Config
	issuer *certmagic.ACMEIssuer
}

// New sets certmagic up; nothing is fetched before Run.
func New(opts Options) (*Manager, error) {
	if len(opts.Domains) == 0 {
		return nil, errors.New("acme: no domain")
	}
	if opts.Storage == nil {
		return nil, errors.New("acme: no storage")
	}
	if opts.CA == "" {
		opts.CA = certmagic.LetsEncryptProductionCA
	}
	m := &Manager{opts: opts, log: opts.Logger}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	zl := zapLogger(m.log.With("part", "acme"))
	m.cache = certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert:   func(certmagic.Certificate) (*certmagic.Config, error) { return m.cfg, nil },
		RenewCheckInterval: opts.RenewCheckInterval,
		Logger:             zl,
	})
	m.cfg = certmagic.New(m.cache, certmagic.Config{
		Storage:            opts.Storage,
		RenewalWindowRatio: opts.RenewalWindowRatio,
		DefaultServerName:  opts.Domains[0],
		Logger:             zl,
	})
	m.issuer = certmagic.NewACMEIssuer(m.cfg, certmagic.ACMEIssuer{
		CA:     opts.CA,
		Email:  opts.Email,
		Agreed: true, // --acme-domain is the operator's agreement
		// The gateway serves HTTP-01 itself; it has no TCP TLS listener
		// for TLS-ALPN-01.
		DisableTLSALPNChallenge: true,
		ListenHost:              opts.HTTPHost,
		AltHTTPPort:             opts.HTTPPort,
		TrustedRoots:            opts.CARoots,
		Logger:                  zl,
	})
	m.cfg.Issuers = []certmagic.Issuer{m.issuer}
	return m, nil
}

// Run loads the certificates from the storage, obtains or renews what is
// missing or due in the background (retrying with backoff), and keeps
// them renewed until ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	defer m.cache.Stop()
	m.log.Info("ACME: managing the serving certificate", "domains", m.opts.Domains, "ca", m.opts.CA, "storage", fmt.Sprint(m.opts.Storage))
	if err := m.cfg.ManageAsync(ctx, m.opts.Domains); err != nil {
		return fmt.Errorf("acme: %w", err)
	}
	<-ctx.Done()
	return nil
}

// GetCertificate is the tls.Config callback: the certificate for the
// ClientHello's name (or the first domain's) from certmagic's cache.
func (m *Manager) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	return m.cfg.GetCertificate(hello)
}

// HTTPHandler answers ACME HTTP-01 challenges (this replica's or, through
// the storage, another's) and 404 to everything else.
func (m *Manager) HTTPHandler() http.Handler {
	return m.issuer.HTTPChallengeHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "this port serves ACME HTTP-01 challenges only", http.StatusNotFound)
	}))
}

// Leaf returns the certificate that expires first among the newest one
// of each domain, or nil while some domain has none yet.
func (m *Manager) Leaf() *x509.Certificate {
	var first *x509.Certificate
	for _, d := range m.opts.Domains {
		var newest *x509.Certificate
		for _, c := range m.cache.AllMatchingCertificates(d) {
			if c.Leaf != nil && (newest == nil || c.Leaf.NotAfter.After(newest.NotAfter)) {
				newest = c.Leaf
			}
		}
		if newest == nil {
			return nil
		}
		if first == nil || newest.NotAfter.Before(first.NotAfter) {
			first = newest
		}
	}
	return first
}

// Ready reports whether every domain has a certificate.
func (m *Manager) Ready() error {
	for _, d := range m.opts.Domains {
		if len(m.cache.AllMatchingCertificates(d)) == 0 {
			return fmt.Errorf("no ACME certificate for %s yet", d)
		}
	}
	return nil
}

// ResetKey returns the key the QUIC stateless reset key is derived from
// (tunnel.StatelessResetKey). With ACME the serving key changes at every
// renewal, so it is a key of its own: an Ed25519 key made once and kept in
// the storage (ResetKeyStorageKey). It survives restarts and renewals, and
// replicas sharing the storage share it, as replicas sharing a serving key
// do in the other modes.
func (m *Manager) ResetKey(ctx context.Context) (crypto.PrivateKey, error) {
	key, err := m.loadResetKey(ctx)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	const lock = "tether_quic_stateless_reset_key"
	if err := m.opts.Storage.Lock(ctx, lock); err != nil {
		return nil, fmt.Errorf("stateless reset key: %w", err)
	}
	defer m.opts.Storage.Unlock(context.WithoutCancel(ctx), lock)
	if key, err := m.loadResetKey(ctx); !errors.Is(err, fs.ErrNotExist) {
		return key, err // another replica made it meanwhile
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	if err := m.opts.Storage.Store(ctx, ResetKeyStorageKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err != nil {
		return nil, fmt.Errorf("stateless reset key: %w", err)
	}
	return priv, nil
}

func (m *Manager) loadResetKey(ctx context.Context) (crypto.PrivateKey, error) {
	b, err := m.opts.Storage.Load(ctx, ResetKeyStorageKey)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fs.ErrNotExist
	}
	if err != nil {
		return nil, fmt.Errorf("stateless reset key: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("stateless reset key %s: no PEM block", ResetKeyStorageKey)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("stateless reset key %s: %w", ResetKeyStorageKey, err)
	}
	return key, nil
}
