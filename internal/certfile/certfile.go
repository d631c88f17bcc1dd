// Package certfile reads TLS key pairs and CA bundles from PEM files and
// reads them again when the files change, so that a certificate rotated on
// disk (by the kubelet, cert-manager, a Kubernetes Secret volume, an
// operator's cp) is used for the next handshake without a restart.
// Connections already up are untouched: TLS uses a certificate only during
// the handshake.
//
// A change is noticed by stat: each use compares the files' identity
// (device and inode), size and modification time with those of the version
// in use, which costs two or three system calls and no read. A Kubernetes
// Secret volume swaps a symlink, which changes the inode; a rewrite in
// place changes the size or the time.
//
// Files that changed but do not load — a rotation half written, a key that
// does not match the new certificate yet, a bundle cut short — leave the
// previous version in use; they are read again once they change again, and
// each such state is logged once, not once per handshake.
package certfile

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/tether-edge/tether/internal/ticker"
)

// Options configure LoadKeyPair and LoadCAs.
type Options struct {
	// Name says what the files are in logs and errors, such as
	// "--tls-cert"; default the file name.
	Name string
	// Logger receives a line when the files change: loaded, or not
	// loadable and the previous version kept. Nil discards.
	Logger *slog.Logger
	// Now is the clock for expiry warnings; nil means time.Now.
	Now func() time.Time
}

// KeyPair is a certificate and its private key, read from PEM files.
type KeyPair struct {
	w      watched[*tls.Certificate]
	loaded *tls.Certificate // the pair LoadKeyPair read, where Watch starts
}

// LoadKeyPair reads the certificate (with its chain) from certPath and the
// key from keyPath; they must load now. Both may be the same file, as the
// kubelet keeps kubelet-client-current.pem.
func LoadKeyPair(certPath, keyPath string, opts Options) (*KeyPair, error) {
	if opts.Name == "" {
		opts.Name = certPath
	}
	k := &KeyPair{}
	k.w.init(opts, func(b [][]byte) (*tls.Certificate, error) {
		// X509KeyPair skips the blocks of the other kind, so one file
		// holding both certificate and key works as either argument.
		cert, err := tls.X509KeyPair(b[0], b[len(b)-1])
		if err != nil {
			return nil, err
		}
		if now := k.w.now(); now.After(cert.Leaf.NotAfter) || now.Before(cert.Leaf.NotBefore) {
			k.w.log.Warn("certificate is outside its validity period; peers will refuse it", "files", k.w.name,
				"subject", cert.Leaf.Subject.String(), "not_before", cert.Leaf.NotBefore, "not_after", cert.Leaf.NotAfter)
		}
		return &cert, nil
	}, func(c *tls.Certificate) []any {
		return []any{"subject", c.Leaf.Subject.String(), "not_after", c.Leaf.NotAfter}
	}, certPath, keyPath)
	cert, err := k.w.get()
	if err != nil {
		return nil, err
	}
	k.loaded = cert
	return k, nil
}

// Certificate returns the current key pair, reading the files again if
// they changed. Once loaded it never fails: files that do not load leave
// the previous pair in use.
func (k *KeyPair) Certificate() (*tls.Certificate, error) { return k.w.get() }

// GetCertificate is for tls.Config.GetCertificate (a server).
func (k *KeyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.w.get()
}

// GetClientCertificate is for tls.Config.GetClientCertificate (a client).
func (k *KeyPair) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return k.w.get()
}

// Watch checks the files every interval until ctx ends and calls changed
// with each new pair that loads. A client that keeps its connections open
// (HTTP/2 to kube-apiserver) makes no handshake to notice a rotation by
// itself; changed is where it moves to new connections before the old
// certificate expires. changed runs on Watch's goroutine. Watch compares
// with the pair LoadKeyPair read, not with what the files hold when Watch
// starts: a rotation in between is reported too.
func (k *KeyPair) Watch(ctx context.Context, interval time.Duration, changed func(*tls.Certificate)) {
	last := k.loaded
	ticker.Every(ctx, nil, interval, func() bool {
		if cur, err := k.w.get(); err == nil && cur != last {
			last = cur
			changed(cur)
		}
		return true
	})
}

// CAs is a bundle of CA certificates read from a PEM file.
type CAs struct{ w watched[*bundle] }

type bundle struct {
	pool  *x509.CertPool
	certs []*x509.Certificate
}

// LoadCAs reads the PEM bundle at path; it must hold at least one
// certificate and nothing else.
func LoadCAs(path string, opts Options) (*CAs, error) {
	if opts.Name == "" {
		opts.Name = path
	}
	c := &CAs{}
	c.w.init(opts, func(b [][]byte) (*bundle, error) {
		certs, err := ParseCertificates(b[0])
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		for _, cert := range certs {
			pool.AddCert(cert)
		}
		return &bundle{pool: pool, certs: certs}, nil
	}, func(b *bundle) []any { return []any{"certificates", len(b.certs)} }, path)
	if _, err := c.w.get(); err != nil {
		return nil, err
	}
	return c, nil
}

// Pool returns the current pool, reading the file again if it changed.
func (c *CAs) Pool() *x509.CertPool {
	b, _ := c.w.get() // loaded once: never fails since
	return b.pool
}

// Certificates returns the current CA certificates.
func (c *CAs) Certificates() []*x509.Certificate {
	b, _ := c.w.get()
	return slices.Clone(b.certs)
}

// ParseCertificates parses a PEM bundle strictly: every block must be a
// certificate, there must be at least one, and nothing but white space may
// follow the last (a bundle cut short is an error, not fewer CAs).
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %d is a %q, not a CERTIFICATE", len(certs)+1, block.Type)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(certs)+1, err)
		}
		certs = append(certs, cert)
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, fmt.Errorf("%d bytes after certificate %d are not PEM (cut short?)", len(bytes.TrimSpace(rest)), len(certs))
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate in it")
	}
	return certs, nil
}

// watched is a value parsed from files, parsed again when they change.
type watched[T any] struct {
	paths []string // distinct
	name  string
	parse func([][]byte) (T, error)
	desc  func(T) []any // log attributes of a loaded value
	log   *slog.Logger
	now   func() time.Time

	mu     sync.Mutex
	cur    T
	loaded []os.FileInfo // of the files cur was parsed from; nil before the first load
	bad    []os.FileInfo // of files that did not parse; not read again until they change
	badErr string        // the last failure logged, so that it is logged once
}

func (w *watched[T]) init(opts Options, parse func([][]byte) (T, error), desc func(T) []any, paths ...string) {
	w.name, w.parse, w.desc, w.log, w.now = opts.Name, parse, desc, opts.Logger, opts.Now
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	if w.now == nil {
		w.now = time.Now
	}
	for _, p := range paths {
		if !slices.Contains(w.paths, p) {
			w.paths = append(w.paths, p)
		}
	}
}

// get returns the current value, parsing the files again if they changed.
// It fails only while nothing has loaded yet.
func (w *watched[T]) get() (T, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// Stat before reading: a write after the stat changes the state again,
	// so the files are read again next time rather than never.
	st, err := stat(w.paths)
	switch {
	case err != nil:
		return w.keep(nil, fmt.Errorf("%s: %w", w.name, err))
	case w.loaded != nil && sameFiles(st, w.loaded):
		return w.cur, nil
	case w.bad != nil && sameFiles(st, w.bad):
		return w.keep(st, errors.New(w.badErr))
	}
	contents := make([][]byte, len(w.paths))
	for i, p := range w.paths {
		if contents[i], err = os.ReadFile(p); err != nil {
			return w.keep(st, fmt.Errorf("%s: %w", w.name, err))
		}
	}
	v, err := w.parse(contents)
	if err != nil {
		return w.keep(st, fmt.Errorf("%s: %w", w.name, err))
	}
	if w.loaded != nil {
		w.log.Info("certificate files changed; new handshakes use them", append([]any{"files", w.name}, w.desc(v)...)...)
	}
	w.cur, w.loaded, w.bad, w.badErr = v, st, nil, ""
	return v, nil
}

// keep returns the value in use after the files in state st failed with
// err (st nil: they could not even be stat'ed, so they are tried again
// next time).
func (w *watched[T]) keep(st []os.FileInfo, err error) (T, error) {
	w.bad = st
	if w.loaded == nil {
		var zero T
		w.badErr = err.Error()
		return zero, err
	}
	if msg := err.Error(); msg != w.badErr {
		w.badErr = msg
		w.log.Warn("certificate files changed but do not load; still using the previous ones", "files", w.name, "err", err)
	}
	return w.cur, nil
}

func stat(paths []string) ([]os.FileInfo, error) {
	st := make([]os.FileInfo, len(paths))
	var errs []error
	for i, p := range paths {
		var err error
		if st[i], err = os.Stat(p); err != nil {
			errs = append(errs, err)
		}
	}
	return st, errors.Join(errs...)
}

func sameFiles(a, b []os.FileInfo) bool {
	return slices.EqualFunc(a, b, func(x, y os.FileInfo) bool {
		return os.SameFile(x, y) && x.Size() == y.Size() && x.ModTime().Equal(y.ModTime())
	})
}
