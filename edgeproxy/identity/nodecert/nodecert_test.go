package nodecert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/internal/testenv"
)

const cn = "system:node:edge-1"

func TestRotationDeadline(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	na := nb.Add(100 * time.Hour)
	for _, tc := range []struct {
		r    float64
		want time.Duration
	}{{0, 70 * time.Hour}, {0.5, 80 * time.Hour}, {0.999999, 90 * time.Hour}} {
		if got := RotationDeadline(nb, na, tc.r).Sub(nb); got.Round(time.Minute) != tc.want {
			t.Errorf("r=%v: %v after notBefore, want %v", tc.r, got, tc.want)
		}
	}
}

func TestStore(t *testing.T) {
	ca := testenv.MustCA(t, "test CA")
	dir := filepath.Join(t.TempDir(), "pki")
	s, err := NewStore(dir, "edge")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Current(); !errors.Is(err, ErrNoCertificate) {
		t.Fatalf("empty store: %v, want ErrNoCertificate", err)
	}
	// A pair written as a plain file (by hand, or by a test) is read, and
	// replaced by the first update.
	cert1, key1 := issue(t, ca, cn, time.Hour)
	if err := os.WriteFile(s.CurrentPath(), append(cert1, key1...), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := s.Current()
	if err != nil || got.Leaf.Subject.CommonName != cn {
		t.Fatalf("plain file: %v, %v", got, err)
	}
	var serials []*big.Int
	// File names have a resolution of a second: a clock a second apart
	// for each update.
	at := time.Now()
	s.now = func() time.Time { return at }
	for range 4 {
		at = at.Add(time.Second)
		c, k := issue(t, ca, cn, time.Hour)
		got, err := s.Update(c, k)
		if err != nil {
			t.Fatal(err)
		}
		serials = append(serials, got.Leaf.SerialNumber)
	}
	cur, err := s.Current()
	if err != nil || cur.Leaf.SerialNumber.Cmp(serials[3]) != 0 {
		t.Fatalf("current is not the last update: %v", err)
	}
	if fi, err := os.Lstat(s.CurrentPath()); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("current is not a symlink: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "edge-[0-9]*.pem"))
	if len(files) != 3 {
		t.Errorf("%d certificate files kept, want the current and 2 earlier: %v", len(files), files)
	}
	for _, f := range files {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v", f, fi.Mode(), err)
		}
	}
	// A certificate that is not for the key is refused; the current
	// stays.
	c, _ := issue(t, ca, cn, time.Hour)
	if _, err := s.Update(c, key1); err == nil {
		t.Fatal("mismatched key stored")
	}
	if cur, err := s.Current(); err != nil || cur.Leaf.SerialNumber.Cmp(serials[3]) != 0 {
		t.Fatalf("current changed by a refused update: %v", err)
	}
}

func TestManager(t *testing.T) {
	ca := testenv.MustCA(t, "test CA")
	start := func(t *testing.T, api *fakeCSRs, store *Store) (*Manager, chan *tls.Certificate, chan error, chan *tls.Certificate) {
		t.Helper()
		issued, failed, asked := make(chan *tls.Certificate, 10), make(chan error, 10), make(chan *tls.Certificate, 10)
		m, err := New(Config{
			Store: store, Template: &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}}},
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
			SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
			Client:     func(cur *tls.Certificate) (CSRs, error) { asked <- cur; return api, nil },
			Accept:     func(c *tls.Certificate) bool { return c.Leaf.Subject.CommonName == cn },
			Issued:     func(c *tls.Certificate) { issued <- c },
			Failed:     func(err error) { failed <- err },
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); m.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return m, issued, failed, asked
	}
	newStore := func(t *testing.T) *Store {
		s, err := NewStore(t.TempDir(), "edge")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	wait := func(t *testing.T, ch chan *tls.Certificate, what string) *tls.Certificate {
		t.Helper()
		select {
		case c := <-ch:
			return c
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s", what)
			return nil
		}
	}

	t.Run("ObtainsWithBootstrapCredentials", func(t *testing.T) {
		api := &fakeCSRs{ca: ca, life: time.Hour}
		m, issued, _, asked := start(t, api, newStore(t))
		if cur := wait(t, asked, "request"); cur != nil {
			t.Errorf("first request with certificate %s, want the bootstrap credentials", cur.Leaf.Subject)
		}
		c := wait(t, issued, "certificate")
		if c.Leaf.Subject.CommonName != cn || m.Current() != c {
			t.Errorf("issued %s; current %v", c.Leaf.Subject, m.Current())
		}
		csr := api.last()
		if csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName || len(csr.Spec.Usages) != 2 {
			t.Errorf("CSR spec %+v", csr.Spec)
		}
		// An hour's certificate: the next renewal is 42 minutes away.
		select {
		case <-asked:
			t.Error("renewed a fresh certificate")
		case <-time.After(300 * time.Millisecond):
		}
	})

	t.Run("RenewsWithTheCurrent", func(t *testing.T) {
		store := newStore(t)
		// Issued 58 minutes ago for an hour: past its latest rotation
		// point (90 %), and still valid.
		c, k := issueAt(t, ca, cn, time.Now().Add(-58*time.Minute), time.Hour)
		old, err := store.Update(c, k)
		if err != nil {
			t.Fatal(err)
		}
		api := &fakeCSRs{ca: ca, life: time.Hour}
		m, issued, _, asked := start(t, api, store)
		if cur := wait(t, asked, "request"); cur == nil || cur.Leaf.SerialNumber.Cmp(old.Leaf.SerialNumber) != 0 {
			t.Errorf("renewal not asked with the current certificate")
		}
		n := wait(t, issued, "certificate")
		if n.Leaf.SerialNumber.Cmp(old.Leaf.SerialNumber) == 0 || m.Current() != n {
			t.Error("not replaced")
		}
		if s, err := store.Current(); err != nil || s.Leaf.SerialNumber.Cmp(n.Leaf.SerialNumber) != 0 {
			t.Errorf("store does not hold the new certificate: %v", err)
		}
	})

	t.Run("AnotherNodesIsReplaced", func(t *testing.T) {
		store := newStore(t)
		c, k := issue(t, ca, "system:node:other", time.Hour)
		if _, err := store.Update(c, k); err != nil {
			t.Fatal(err)
		}
		api := &fakeCSRs{ca: ca, life: time.Hour}
		m, issued, _, asked := start(t, api, store)
		if m.Current() != nil && m.Current().Leaf.Subject.CommonName != cn {
			t.Error("another node's certificate offered")
		}
		if cur := wait(t, asked, "request"); cur != nil {
			t.Error("asked with another node's certificate")
		}
		if c := wait(t, issued, "certificate"); c.Leaf.Subject.CommonName != cn {
			t.Errorf("issued %s", c.Leaf.Subject)
		}
	})

	t.Run("DeniedIsRetried", func(t *testing.T) {
		api := &fakeCSRs{ca: ca, life: time.Hour, deny: 1}
		_, issued, failed, _ := start(t, api, newStore(t))
		select {
		case err := <-failed:
			t.Logf("failure: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("a denied request is not a failure")
		}
		wait(t, issued, "certificate after the retry")
	})

	t.Run("WatchEndedIsReadAgain", func(t *testing.T) {
		// The first watch ends before a decision: the request is read
		// again, after a pause, and no failure is counted.
		api := &fakeCSRs{ca: ca, life: time.Hour, endWatches: 1}
		_, issued, failed, _ := start(t, api, newStore(t))
		wait(t, issued, "certificate after the watch ended")
		select {
		case err := <-failed:
			t.Errorf("an ended watch counted as a failure: %v", err)
		default:
		}
		if w, g := api.counts(); w != 1 || g != 1 {
			t.Errorf("%d watches and %d reads, want 1 and 1", w, g)
		}
	})
}

// fakeCSRs signs (or denies) each request at once with ca.
type fakeCSRs struct {
	ca   *testenv.CA
	life time.Duration
	deny int // the first deny requests are denied
	// endWatches is how many watches end at once, before a decision.
	endWatches int

	mu            sync.Mutex
	csrs          []*certificatesv1.CertificateSigningRequest
	watches, gets int
}

func (f *fakeCSRs) counts() (watches, gets int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.watches, f.gets
}

func (f *fakeCSRs) Create(_ context.Context, csr *certificatesv1.CertificateSigningRequest, _ metav1.CreateOptions) (*certificatesv1.CertificateSigningRequest, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := csr.DeepCopy()
	c.Name = csr.GenerateName + string(rune('a'+len(f.csrs)))
	c.UID = types.UID(c.Name)
	c.ResourceVersion = "1"
	f.csrs = append(f.csrs, c)
	return c.DeepCopy(), nil
}

func (f *fakeCSRs) last() *certificatesv1.CertificateSigningRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.csrs[len(f.csrs)-1]
}

// decide decides csr the first time it is asked for.
func (f *fakeCSRs) decide(name string) (*certificatesv1.CertificateSigningRequest, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, c := range f.csrs {
		if c.Name != name {
			continue
		}
		if len(c.Status.Conditions) == 0 {
			if i < f.deny {
				c.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "Test"}}
			} else {
				c.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}}
				b, _ := pem.Decode(c.Spec.Request)
				req, err := x509.ParseCertificateRequest(b.Bytes)
				if err != nil {
					return nil, err
				}
				tmpl := nodeTemplate(req.Subject.CommonName, time.Now().Add(-time.Minute), f.life)
				if c.Status.Certificate, err = f.ca.IssueFor(tmpl, req.PublicKey); err != nil {
					return nil, err
				}
			}
			c.ResourceVersion = "2"
		}
		return c.DeepCopy(), nil
	}
	return nil, errors.New("not found")
}

func (f *fakeCSRs) Get(_ context.Context, name string, _ metav1.GetOptions) (*certificatesv1.CertificateSigningRequest, error) {
	f.mu.Lock()
	f.gets++
	f.mu.Unlock()
	return f.decide(name)
}

func (f *fakeCSRs) Watch(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
	f.mu.Lock()
	f.watches++
	end := f.watches <= f.endWatches
	f.mu.Unlock()
	if end {
		w := watch.NewFake()
		w.Stop() // its channel is closed
		return w, nil
	}
	name := o.FieldSelector[len("metadata.name="):]
	c, err := f.decide(name)
	if err != nil {
		return nil, err
	}
	w := watch.NewFakeWithChanSize(1, false)
	w.Modify(c)
	return w, nil
}

// issue is a node certificate of ca, valid for life from a minute ago.
func issue(t *testing.T, ca *testenv.CA, cn string, life time.Duration) (certPEM, keyPEM []byte) {
	return issueAt(t, ca, cn, time.Now().Add(-time.Minute), life)
}

func issueAt(t *testing.T, ca *testenv.CA, cn string, notBefore time.Time, life time.Duration) (certPEM, keyPEM []byte) {
	t.Helper()
	kp, err := ca.Issue(nodeTemplate(cn, notBefore, life))
	if err != nil {
		t.Fatal(err)
	}
	return kp.CertPEM, kp.KeyPEM
}

func nodeTemplate(cn string, notBefore time.Time, life time.Duration) testenv.Template {
	return testenv.Template{CommonName: cn, Organizations: []string{"system:nodes"}, NotBefore: notBefore,
		NotAfter: notBefore.Add(life), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
}
