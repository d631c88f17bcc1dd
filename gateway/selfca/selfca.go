// Package selfca is the gateway's self-managed certificate authority, for
// a gateway given neither --tls-cert/--tls-key nor ACME: a CA of its own
// under --data-dir issues the gateway's serving certificate and renews it
// before it expires. Edges trust the CA (their --gateway-ca), which
// `tetherctl ca` prints, so the serving certificate can change without
// anything to do on the edges.
//
// Files, in Options.Dir (mode 0700):
//
//	ca.crt       the CA certificate: what edges need (also GET /ca.crt on the admin port)
//	ca.key       its key (0600); never leaves the directory
//	serving.crt  the serving certificate, issued by the CA for Options.Names
//	serving.key  its key (0600)
//
// A CA found in the directory is used as it is, so several replicas can
// share one: copy ca.crt and ca.key into each replica's directory before
// its first start. Each replica then issues its own serving certificate,
// and edges need one CA for all of them.
//
// The serving certificate is issued again when it is missing, does not
// load, was not issued by the CA, does not name exactly Options.Names, or
// has less than a third of its life left; Run checks every
// Options.CheckInterval. Files are written to a temporary name and renamed,
// the key before the certificate, and readers (internal/certfile) keep the
// previous pair until both match, so a reader never sees half a renewal.
// The CA itself is not renewed: it lives DefaultCAValidity, and a warning is
// logged during its last year.
package selfca

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/internal/certfile"
	"github.com/tether-edge/tether/internal/ticker"
)

// File names in Options.Dir.
const (
	CAFile      = "ca.crt"
	CAKeyFile   = "ca.key"
	CertFile    = "serving.crt"
	CertKeyFile = "serving.key"
)

// Defaults for Options.
const (
	DefaultCAValidity    = 10 * 365 * 24 * time.Hour
	DefaultCertValidity  = 90 * 24 * time.Hour
	DefaultCheckInterval = time.Hour
	// caWarnBefore: the CA's expiry is logged as a warning this long
	// before.
	caWarnBefore = 365 * 24 * time.Hour
	// backdate: certificates start this long before they are issued, for
	// peers whose clocks are a little behind.
	backdate = 5 * time.Minute
)

// Options configure Open.
type Options struct {
	// Dir holds the CA and the serving certificate (--data-dir); created
	// if missing.
	Dir string
	// Names are the serving certificate's subject alternative names (the
	// host names and addresses edges dial, --server-name): IP addresses or
	// DNS names. At least one.
	Names []string
	// CertValidity is the serving certificate's lifetime; 0 means
	// DefaultCertValidity.
	CertValidity time.Duration
	// CheckInterval is how often Run checks the serving certificate; 0
	// means DefaultCheckInterval.
	CheckInterval time.Duration
	// Clock; nil means the real clock.
	Clock clock.WithTicker
	// Logger; nil discards.
	Logger *slog.Logger
}

// Authority is a CA in a directory that keeps the serving certificate
// there valid.
type Authority struct {
	opts  Options
	clock clock.WithTicker
	log   *slog.Logger
	ca    *x509.Certificate
	caKey crypto.Signer
	caPEM []byte
}

// Open loads the CA from opts.Dir, creating it if the directory has none,
// and issues the serving certificate if it needs to be.
func Open(opts Options) (*Authority, error) {
	if opts.Dir == "" {
		return nil, errors.New("self-managed CA: no data directory")
	}
	if len(opts.Names) == 0 {
		return nil, errors.New("self-managed CA: no server name for the serving certificate")
	}
	if opts.CertValidity <= 0 {
		opts.CertValidity = DefaultCertValidity
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = DefaultCheckInterval
	}
	a := &Authority{opts: opts, clock: opts.Clock, log: opts.Logger}
	if a.clock == nil {
		a.clock = clock.RealClock{}
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("self-managed CA: %w", err)
	}
	if err := a.loadOrCreateCA(); err != nil {
		return nil, fmt.Errorf("self-managed CA in %s: %w", opts.Dir, err)
	}
	if _, err := a.Renew(); err != nil {
		return nil, err
	}
	return a, nil
}

// CertFile and KeyFile are the serving certificate's files, for
// certfile.LoadKeyPair.
func (a *Authority) CertFile() string { return a.path(CertFile) }
func (a *Authority) KeyFile() string  { return a.path(CertKeyFile) }

// CAPEM is the CA certificate, PEM-encoded: what edges put in their
// --gateway-ca.
func (a *Authority) CAPEM() []byte { return bytes.Clone(a.caPEM) }

// CAKey is the CA's private key. It is stable for the CA's life, unlike
// the serving key (the gateway derives its QUIC stateless reset key from
// it).
func (a *Authority) CAKey() crypto.Signer { return a.caKey }

// Run renews the serving certificate when due, checking every
// CheckInterval, until ctx ends. A failed renewal is logged and tried again
// at the next check; the certificate in use stays.
func (a *Authority) Run(ctx context.Context) error {
	ticker.Every(ctx, a.clock, a.opts.CheckInterval, func() bool {
		if _, err := a.Renew(); err != nil {
			a.log.Error("cannot renew the serving certificate; will try again", "err", err, "in", a.opts.CheckInterval)
		}
		return true
	})
	return nil
}

// Renew issues a new serving certificate if the current one is due (see
// the package doc) and reports whether it did.
func (a *Authority) Renew() (bool, error) {
	now := a.clock.Now()
	if left := a.ca.NotAfter.Sub(now); left < caWarnBefore {
		a.log.Warn("the self-managed CA expires soon; make a new one and give it to the edges", "not_after", a.ca.NotAfter, "dir", a.opts.Dir)
	}
	why := a.renewReason(now)
	if why == "" {
		return false, nil
	}
	leaf, err := a.issue(now)
	if err != nil {
		return false, fmt.Errorf("self-managed CA: issue the serving certificate: %w", err)
	}
	a.log.Info("issued the serving certificate", "why", why, "names", a.opts.Names, "not_after", leaf.NotAfter, "dir", a.opts.Dir)
	return true, nil
}

// renewReason says why the serving certificate must be issued, or "".
func (a *Authority) renewReason(now time.Time) string {
	kp, err := certfile.LoadKeyPair(a.CertFile(), a.KeyFile(), certfile.Options{Now: func() time.Time { return now }})
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "none yet"
		}
		return "the files do not load: " + err.Error()
	}
	c, _ := kp.Certificate()
	leaf := c.Leaf
	if err := leaf.CheckSignatureFrom(a.ca); err != nil {
		return "not issued by this CA"
	}
	if !slices.Equal(sans(leaf), normalize(a.opts.Names)) {
		return fmt.Sprintf("names changed from %v", sans(leaf))
	}
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	if now.After(leaf.NotAfter.Add(-life / 3)) {
		return "a third of its life left"
	}
	return ""
}

func (a *Authority) loadOrCreateCA() error {
	certPEM, err := os.ReadFile(a.path(CAFile))
	if errors.Is(err, fs.ErrNotExist) {
		return a.createCA()
	} else if err != nil {
		return fmt.Errorf("read the CA: %w", err)
	}
	keyPEM, err := os.ReadFile(a.path(CAKeyFile))
	if err != nil {
		return fmt.Errorf("read the CA's key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("load %s and %s: %w", CAFile, CAKeyFile, err)
	}
	if !pair.Leaf.IsCA {
		return fmt.Errorf("%s is not a CA certificate", CAFile)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return fmt.Errorf("%s: unsupported key type %T", CAKeyFile, pair.PrivateKey)
	}
	a.ca, a.caKey, a.caPEM = pair.Leaf, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pair.Leaf.Raw})
	return nil
}

func (a *Authority) createCA() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate the CA key: %w", err)
	}
	now := a.clock.Now()
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "tether-gateway CA " + host + " " + now.UTC().Format("2006-01-02")},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(DefaultCAValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true, // it signs serving certificates, never another CA
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := sign(tmpl, tmpl, key.Public(), key)
	if err != nil {
		return fmt.Errorf("self-sign the CA: %w", err)
	}
	keyPEM, err := keyPEM(key)
	if err != nil {
		return err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	// The key first: the certificate says there is a CA (see
	// loadOrCreateCA), so it must not be there without its key.
	if err := writeFile(a.path(CAKeyFile), keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeFile(a.path(CAFile), certPEM, 0o644); err != nil {
		return err
	}
	cert, _ := x509.ParseCertificate(der)
	a.ca, a.caKey, a.caPEM = cert, key, certPEM
	a.log.Info("created the self-managed CA; edges need its certificate as their --gateway-ca (`tetherctl ca`)",
		"file", a.path(CAFile), "not_after", cert.NotAfter)
	return nil
}

// issue writes a new serving key and certificate and returns the
// certificate.
func (a *Authority) issue(now time.Time) (*x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	names := normalize(a.opts.Names)
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: names[0]},
		NotBefore:   now.Add(-backdate),
		NotAfter:    now.Add(a.opts.CertValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if tmpl.NotAfter.After(a.ca.NotAfter) {
		tmpl.NotAfter = a.ca.NotAfter
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := sign(tmpl, a.ca, key.Public(), a.caKey)
	if err != nil {
		return nil, err
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, err
	}
	if err := writeFile(a.KeyFile(), kp, 0o600); err != nil {
		return nil, err
	}
	if err := writeFile(a.CertFile(), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// ValidName reports why n cannot be a serving certificate name (an IP
// address or a DNS name), or "" when it can.
func ValidName(n string) string {
	if net.ParseIP(n) != nil {
		return ""
	}
	return strings.Join(validation.IsDNS1123Subdomain(strings.ToLower(strings.TrimSuffix(n, "."))), "; ")
}

// normalize lower-cases names, writes IP addresses in their canonical
// form, drops duplicates and sorts them, keeping the first given first
// (it is the subject's common name).
func normalize(names []string) []string {
	var out []string
	for _, n := range names {
		n = strings.ToLower(strings.TrimSuffix(n, "."))
		if ip := net.ParseIP(n); ip != nil {
			n = ip.String()
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(out) > 1 {
		slices.Sort(out[1:])
	}
	return out
}

// sans are a certificate's names in normalize's order, its common name
// first.
func sans(c *x509.Certificate) []string {
	names := []string{c.Subject.CommonName}
	names = append(names, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	return normalize(names)
}

func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	return x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
}

func keyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// writeFile writes data to path through a temporary file in the same
// directory and a rename, so that a reader sees the old file or the new
// one, never a part.
func writeFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // after a successful rename, there is nothing to remove
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func (a *Authority) path(name string) string { return filepath.Join(a.opts.Dir, name) }
