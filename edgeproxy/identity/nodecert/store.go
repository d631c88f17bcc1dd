package nodecert

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// ErrNoCertificate is Store.Current's error when there is no certificate.
var ErrNoCertificate = errors.New("no certificate")

// Store keeps each certificate with its key in one PEM file,
// <dir>/<prefix>-<time>.pem (mode 0600), and the symlink
// <dir>/<prefix>-current.pem to the one in use. It is the layout of
// client-go's certificate file store, the kubelet's, so a data directory
// written by either is read by the other.
type Store struct {
	dir, prefix string
	// keep is how many earlier certificates are kept beside the current.
	keep int
	// now names the files; tests move it on.
	now func() time.Time
}

// NewStore returns the store of dir (created, mode 0700, if missing).
func NewStore(dir, prefix string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("certificate store: %w", err)
	}
	return &Store{dir: dir, prefix: prefix, keep: 2, now: time.Now}, nil
}

// CurrentPath is the file of the certificate in use.
func (s *Store) CurrentPath() string { return filepath.Join(s.dir, s.prefix+"-current.pem") }

// Current loads the certificate in use, with its parsed leaf, or
// ErrNoCertificate. It may have expired.
func (s *Store) Current() (*tls.Certificate, error) {
	data, err := os.ReadFile(s.CurrentPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoCertificate
	}
	if err != nil {
		return nil, fmt.Errorf("certificate store: %w", err)
	}
	cert, err := parsePair(data)
	if err != nil {
		return nil, fmt.Errorf("certificate store: %s: %w", s.CurrentPath(), err)
	}
	return cert, nil
}

// Update stores certPEM (the leaf first, then any intermediates) with
// keyPEM and makes it current. Readers see the previous pair or the new
// one, never a part: the file is written aside, synced, renamed into
// place, and the symlink is replaced by a rename.
func (s *Store) Update(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	data := append(append([]byte{}, certPEM...), keyPEM...)
	cert, err := parsePair(data)
	if err != nil {
		return nil, fmt.Errorf("certificate store: new certificate: %w", err)
	}
	name := fmt.Sprintf("%s-%s.pem", s.prefix, s.now().Format("2006-01-02-15-04-05"))
	if err := writeSynced(filepath.Join(s.dir, name), data); err != nil {
		return nil, fmt.Errorf("certificate store: %w", err)
	}
	link := filepath.Join(s.dir, s.prefix+"-updated.pem")
	os.Remove(link)
	if err := os.Symlink(name, link); err != nil {
		return nil, fmt.Errorf("certificate store: %w", err)
	}
	if err := os.Rename(link, s.CurrentPath()); err != nil {
		return nil, fmt.Errorf("certificate store: %w", err)
	}
	s.prune(name)
	return cert, nil
}

// prune removes all but the keep newest earlier certificates.
func (s *Store) prune(current string) {
	files, err := filepath.Glob(filepath.Join(s.dir, s.prefix+"-[0-9]*.pem"))
	if err != nil {
		return
	}
	slices.Sort(files) // the names sort by time
	files = slices.DeleteFunc(files, func(f string) bool { return filepath.Base(f) == current })
	for _, f := range files[:max(0, len(files)-s.keep)] {
		os.Remove(f)
	}
}

func writeSynced(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// parsePair parses PEM certificates and a private key, in any order, with
// the leaf parsed.
func parsePair(data []byte) (*tls.Certificate, error) {
	var certPEM, keyPEM []byte
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		enc := pem.EncodeToMemory(b)
		if b.Type == "CERTIFICATE" {
			certPEM = append(certPEM, enc...)
		} else if strings.HasSuffix(b.Type, "PRIVATE KEY") {
			keyPEM = append(keyPEM, enc...)
		}
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, err
		}
	}
	return &cert, nil
}
