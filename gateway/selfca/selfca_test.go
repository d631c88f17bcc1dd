package selfca

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/internal/certfile"
	"github.com/tether-edge/tether/internal/testenv"
)

func serving(t *testing.T, a *Authority) *x509.Certificate {
	t.Helper()
	kp, err := certfile.LoadKeyPair(a.CertFile(), a.KeyFile(), certfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := kp.Certificate()
	return c.Leaf
}

func pool(t *testing.T, a *Authority) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(a.CAPEM()) {
		t.Fatal("CAPEM holds no certificate")
	}
	return p
}

func TestOpenCreatesCAAndServingCertificate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tether-gateway")
	clk := clocktesting.NewFakeClock(time.Now())
	a, err := Open(Options{Dir: dir, Names: []string{"gw.example.internal", "10.0.0.5", "fd00::5"}, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{"": 0o700, CAKeyFile: 0o600, CertKeyFile: 0o600, CAFile: 0o644, CertFile: 0o644} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s/%s: mode %v, want %v", dir, name, st.Mode().Perm(), mode)
		}
	}
	leaf := serving(t, a)
	for _, name := range []string{"gw.example.internal", "10.0.0.5", "fd00::5"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool(t, a), CurrentTime: clk.Now()}); err != nil {
			t.Errorf("serving certificate for %s: %v", name, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "other.example.internal", Roots: pool(t, a), CurrentTime: clk.Now()}); err == nil {
		t.Error("the serving certificate is valid for a name it was not given")
	}
	if got := leaf.NotAfter.Sub(leaf.NotBefore); got < DefaultCertValidity || got > DefaultCertValidity+time.Hour {
		t.Errorf("serving certificate lives %v, want about %v", got, DefaultCertValidity)
	}

	// Opened again: the same CA, the same certificate.
	b, err := Open(Options{Dir: dir, Names: []string{"gw.example.internal", "fd00::5", "10.0.0.5"}, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if string(b.CAPEM()) != string(a.CAPEM()) || serving(t, b).SerialNumber.Cmp(leaf.SerialNumber) != 0 {
		t.Fatal("opening the directory again changed the CA or the certificate")
	}

	// Another name: issued again, by the same CA.
	c, err := Open(Options{Dir: dir, Names: []string{"gw.example.internal", "10.0.0.6"}, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	next := serving(t, c)
	if next.SerialNumber.Cmp(leaf.SerialNumber) == 0 {
		t.Fatal("a changed name kept the old certificate")
	}
	if _, err := next.Verify(x509.VerifyOptions{DNSName: "10.0.0.6", Roots: pool(t, a), CurrentTime: clk.Now()}); err != nil {
		t.Errorf("reissued certificate: %v", err)
	}
}

func TestRunRenewsBeforeExpiry(t *testing.T) {
	dir := t.TempDir()
	clk := clocktesting.NewFakeClock(time.Now())
	a, err := Open(Options{Dir: dir, Names: []string{"gw"}, Clock: clk, CertValidity: 30 * time.Hour, CheckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// Readers follow the files, as the gateway's listener does.
	kp, err := certfile.LoadKeyPair(a.CertFile(), a.KeyFile(), certfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := kp.Certificate()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()

	current := func() *x509.Certificate {
		c, _ := kp.Certificate()
		return c.Leaf
	}
	// Up to two thirds of its life, nothing changes.
	for range 19 {
		waitTicker(t, clk)
		clk.Step(time.Hour)
	}
	if current().SerialNumber.Cmp(first.Leaf.SerialNumber) != 0 {
		t.Fatal("renewed with more than a third of the life left")
	}
	// Past two thirds (20 h of 30 h, counting the backdating), the next
	// check renews it.
	testenv.Eventually(t, "a renewal past two thirds of its life", func() bool {
		if current().SerialNumber.Cmp(first.Leaf.SerialNumber) != 0 {
			return true
		}
		waitTicker(t, clk)
		clk.Step(time.Hour)
		return false
	})
	if got := current(); !got.NotAfter.After(first.Leaf.NotAfter) {
		t.Errorf("renewed certificate ends %v, not after the old %v", got.NotAfter, first.Leaf.NotAfter)
	}
}

// waitTicker waits until Run's ticker is registered with the fake clock.
func waitTicker(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	testenv.Eventually(t, "Run's ticker", clk.HasWaiters)
}

// A CA put into the directory before the first start is used: replicas
// can share one.
func TestGivenCA(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.MustCA(t, "shared gateway CA")
	if _, err := ca.WriteFile(dir, "ca"); err != nil {
		t.Fatal(err)
	}
	key, err := testenv.MarshalKeyPEM(ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, CAKeyFile), key, 0o600)
	a, err := Open(Options{Dir: dir, Names: []string{"gw-1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := serving(t, a).Verify(x509.VerifyOptions{DNSName: "gw-1", Roots: ca.Pool()}); err != nil {
		t.Fatalf("serving certificate not issued by the given CA: %v", err)
	}
}

func TestOpenRefuses(t *testing.T) {
	t.Run("a CA certificate without its key", func(t *testing.T) {
		dir := t.TempDir()
		ca := testenv.MustCA(t, "ca")
		ca.WriteFile(dir, "ca")
		if _, err := Open(Options{Dir: dir, Names: []string{"gw"}}); err == nil || !strings.Contains(err.Error(), "key") {
			t.Fatalf("Open: %v", err)
		}
	})
	t.Run("a certificate that is no CA", func(t *testing.T) {
		dir := t.TempDir()
		ca := testenv.MustCA(t, "ca")
		leaf, err := ca.ServerCert("not-a-ca", "x")
		if err != nil {
			t.Fatal(err)
		}
		leaf.WriteFiles(dir, "ca")
		if _, err := Open(Options{Dir: dir, Names: []string{"gw"}}); err == nil || !strings.Contains(err.Error(), "not a CA") {
			t.Fatalf("Open: %v", err)
		}
	})
	t.Run("no name", func(t *testing.T) {
		if _, err := Open(Options{Dir: t.TempDir()}); err == nil {
			t.Fatal("Open without a name")
		}
	})
}

func TestValidName(t *testing.T) {
	for name, ok := range map[string]bool{
		"gw.example.internal": true, "GW.Example.Internal.": true, "10.0.0.5": true, "fd00::5": true,
		"": false, "-gw": false, "gw_1": false, "a..b": false, "*.example.com": false,
	} {
		if got := ValidName(name) == ""; got != ok {
			t.Errorf("ValidName(%q) = %q", name, ValidName(name))
		}
	}
}
