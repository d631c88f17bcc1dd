package certfile

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/testenv"
)

// logs collects log records' messages.
type logs struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logs) WithGroup(string) slog.Handler            { return l }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Level.String()+" "+r.Message)
	return nil
}

func (l *logs) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// write replaces path's content in place, with a modification time of its
// own so that the change is seen even on a coarse clock.
func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	bump(t, path)
}

var mtime = time.Now().Add(-time.Hour)

func bump(t *testing.T, path string) {
	t.Helper()
	mtime = mtime.Add(time.Second)
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

func issue(t *testing.T, ca *testenv.CA, cn string) *testenv.KeyPair {
	t.Helper()
	kp, err := ca.ServerCert(cn, cn)
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func subject(t *testing.T, k *KeyPair) string {
	t.Helper()
	c, err := k.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	return c.Leaf.Subject.CommonName
}

func TestKeyPairRotation(t *testing.T) {
	ca := testenv.MustCA(t, "certfile test")
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	old, next := issue(t, ca, "old"), issue(t, ca, "new")
	write(t, certPath, old.CertPEM)
	write(t, keyPath, old.KeyPEM)
	l := &logs{}
	k, err := LoadKeyPair(certPath, keyPath, Options{Name: "--tls-cert", Logger: slog.New(l)})
	if err != nil {
		t.Fatal(err)
	}
	if got := subject(t, k); got != "old" {
		t.Fatalf("loaded %q", got)
	}

	// Half a rotation: the new certificate, the old key. The old pair
	// stays, and the failure is logged once however often it is asked for.
	write(t, certPath, next.CertPEM)
	for range 3 {
		if got := subject(t, k); got != "old" {
			t.Fatalf("with a mismatched key: %q, want the previous pair", got)
		}
	}
	if n := l.count("WARN certificate files changed but do not load"); n != 1 {
		t.Fatalf("%d warnings for one bad state, want 1: %q", n, l.msgs)
	}

	// The key arrives: the new pair is used.
	write(t, keyPath, next.KeyPEM)
	if got := subject(t, k); got != "new" {
		t.Fatalf("after the rotation: %q", got)
	}
	if n := l.count("INFO certificate files changed"); n != 1 {
		t.Fatalf("%d reload lines, want 1: %q", n, l.msgs)
	}

	// A certificate cut short, then a file gone: the pair in use stays.
	write(t, certPath, old.CertPEM[:len(old.CertPEM)/2])
	if got := subject(t, k); got != "new" {
		t.Fatalf("with a truncated certificate: %q", got)
	}
	os.Remove(keyPath)
	if got := subject(t, k); got != "new" {
		t.Fatalf("with the key gone: %q", got)
	}
	write(t, certPath, old.CertPEM)
	write(t, keyPath, old.KeyPEM)
	if got := subject(t, k); got != "old" {
		t.Fatalf("after rotating back: %q", got)
	}
}

// kubeletPair loads a key pair from one file holding certificate and key,
// as the kubelet keeps kubelet-client-current.pem, issued for "old"; next
// is a pair for "new" to rotate to.
func kubeletPair(t *testing.T) (path string, old, next *testenv.KeyPair, k *KeyPair) {
	t.Helper()
	ca := testenv.MustCA(t, "certfile test")
	path = filepath.Join(t.TempDir(), "kubelet-client-current.pem")
	old, next = issue(t, ca, "old"), issue(t, ca, "new")
	write(t, path, append(old.CertPEM, old.KeyPEM...))
	k, err := LoadKeyPair(path, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return path, old, next, k
}

// Watch reports each rotation that loads, once, and nothing else.
func TestKeyPairWatch(t *testing.T) {
	path, old, next, k := kubeletPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan string, 8)
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.Watch(ctx, 10*time.Millisecond, func(c *tls.Certificate) { changes <- c.Leaf.Subject.CommonName })
	}()
	defer func() { cancel(); <-done }()
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-changes:
			if got != want {
				t.Fatalf("changed to %q, want %q", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no change to %q reported", want)
		}
	}
	quiet := func() {
		t.Helper()
		select {
		case got := <-changes:
			t.Fatalf("changed to %q with no new pair", got)
		case <-time.After(100 * time.Millisecond):
		}
	}
	quiet()
	write(t, path, next.CertPEM[:len(next.CertPEM)/2]) // half written: not a change
	quiet()
	write(t, path, append(next.CertPEM, next.KeyPEM...))
	expect("new")
	quiet()
	write(t, path, append(old.CertPEM, old.KeyPEM...))
	expect("old")
}

// A rotation between LoadKeyPair and Watch's start is reported: Watch
// compares with the pair that was loaded, not with what it finds when it
// starts (the files rewritten before the watcher's goroutine ran went
// unreported).
func TestKeyPairWatchRotatedBeforeStart(t *testing.T) {
	path, _, next, k := kubeletPair(t)
	write(t, path, append(next.CertPEM, next.KeyPEM...))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan string, 1)
	go k.Watch(ctx, 10*time.Millisecond, func(c *tls.Certificate) {
		select {
		case got <- c.Leaf.Subject.CommonName:
		default:
		}
		cancel()
	})
	select {
	case cn := <-got:
		if cn != "new" {
			t.Errorf("changed to %q, want %q", cn, "new")
		}
	case <-ctx.Done():
		t.Fatal("the rotation before Watch started was not reported")
	}
}

// A rewrite that keeps the size and the inode is still seen.
func TestKeyPairSameSizeRewrite(t *testing.T) {
	ca := testenv.MustCA(t, "certfile test")
	path := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
	a, b := issue(t, ca, "aaaa"), issue(t, ca, "bbbb")
	write(t, path, append(a.CertPEM, a.KeyPEM...))
	k, err := LoadKeyPair(path, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	pemB := append(b.CertPEM, b.KeyPEM...)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	st1, _ := f.Stat()
	f.Truncate(0)
	f.WriteAt(pemB, 0)
	f.Close()
	bump(t, path)
	if st2, _ := os.Stat(path); !os.SameFile(st1, st2) {
		t.Fatal("the rewrite changed the inode; the test means to keep it")
	}
	if got := subject(t, k); got != "bbbb" {
		t.Fatalf("after an in-place rewrite: %q", got)
	}
}

// A Kubernetes Secret volume: the files are symlinks through ..data, which
// the kubelet swaps atomically.
func TestKeyPairSecretVolumeSwap(t *testing.T) {
	ca := testenv.MustCA(t, "certfile test")
	dir := t.TempDir()
	mount := func(name string, kp *testenv.KeyPair) {
		ts := filepath.Join(dir, name)
		os.Mkdir(ts, 0o755)
		os.WriteFile(filepath.Join(ts, "tls.crt"), kp.CertPEM, 0o600)
		os.WriteFile(filepath.Join(ts, "tls.key"), kp.KeyPEM, 0o600)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	mount("..2026_01", issue(t, ca, "first"))
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	k, err := LoadKeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := subject(t, k); got != "first" {
		t.Fatalf("loaded %q", got)
	}
	mount("..2026_02", issue(t, ca, "second"))
	if got := subject(t, k); got != "second" {
		t.Fatalf("after the volume update: %q", got)
	}
}

func TestKeyPairMustLoadFirst(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadKeyPair(filepath.Join(dir, "none.crt"), filepath.Join(dir, "none.key"), Options{Name: "--tls-cert"}); err == nil || !strings.Contains(err.Error(), "--tls-cert") {
		t.Fatalf("missing files: %v, want an error naming --tls-cert", err)
	}
	ca := testenv.MustCA(t, "certfile test")
	a, b := issue(t, ca, "a"), issue(t, ca, "b")
	write(t, filepath.Join(dir, "a.crt"), a.CertPEM)
	write(t, filepath.Join(dir, "b.key"), b.KeyPEM)
	if _, err := LoadKeyPair(filepath.Join(dir, "a.crt"), filepath.Join(dir, "b.key"), Options{}); err == nil {
		t.Fatal("a certificate with another key's file loaded")
	}
}

func TestKeyPairWarnsWhenExpired(t *testing.T) {
	ca := testenv.MustCA(t, "certfile test")
	kp, err := ca.Issue(testenv.Template{CommonName: "gone", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "both.pem")
	write(t, path, append(kp.CertPEM, kp.KeyPEM...))
	l := &logs{}
	if _, err := LoadKeyPair(path, path, Options{Logger: slog.New(l)}); err != nil {
		t.Fatal(err)
	}
	if l.count("WARN certificate is outside its validity period") != 1 {
		t.Fatalf("no expiry warning: %q", l.msgs)
	}
}

func TestCAsRotation(t *testing.T) {
	ca1, ca2 := testenv.MustCA(t, "ca-1"), testenv.MustCA(t, "ca-2")
	path := filepath.Join(t.TempDir(), "client-ca.crt")
	write(t, path, ca1.CertPEM)
	l := &logs{}
	c, err := LoadCAs(path, Options{Name: "--client-ca", Logger: slog.New(l)})
	if err != nil {
		t.Fatal(err)
	}
	trusts := func(ca *testenv.CA) bool {
		kp, err := ca.NodeCert("edge-1")
		if err != nil {
			t.Fatal(err)
		}
		_, err = kp.Cert.Verify(x509.VerifyOptions{Roots: c.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		return err == nil
	}
	if !trusts(ca1) || trusts(ca2) {
		t.Fatal("initial pool")
	}

	// Both CAs, as during a CA rotation, but written in two steps: the
	// first step (the second certificate cut short) changes nothing.
	both := append(bytes.Clone(ca1.CertPEM), ca2.CertPEM...)
	write(t, path, both[:len(both)-40])
	if !trusts(ca1) || trusts(ca2) {
		t.Fatal("a bundle cut short changed the pool")
	}
	if l.count("WARN") != 1 {
		t.Fatalf("logs %q, want one warning", l.msgs)
	}
	write(t, path, both)
	if !trusts(ca1) || !trusts(ca2) || len(c.Certificates()) != 2 {
		t.Fatal("the pool lacks a CA of the new bundle")
	}
	// The old CA retired.
	write(t, path, ca2.CertPEM)
	if trusts(ca1) || !trusts(ca2) {
		t.Fatal("the retired CA is still trusted")
	}
}

func TestParseCertificates(t *testing.T) {
	ca := testenv.MustCA(t, "ca")
	kp := issue(t, ca, "x")
	for _, tc := range []struct {
		name string
		in   []byte
		want string // error substring; "" means it parses
	}{
		{"one", ca.CertPEM, ""},
		{"trailing space", append(bytes.Clone(ca.CertPEM), "\n\n  \n"...), ""},
		{"empty", nil, "no PEM certificate"},
		{"a key", kp.KeyPEM, "not a CERTIFICATE"},
		{"cut short", append(bytes.Clone(ca.CertPEM), kp.CertPEM[:30]...), "not PEM"},
		{"garbage", []byte("hello"), "not PEM"},
	} {
		_, err := ParseCertificates(tc.in)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
