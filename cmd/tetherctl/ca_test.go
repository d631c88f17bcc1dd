package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-edge/tether/internal/certfile"
	"github.com/tether-edge/tether/internal/testenv"
)

// serveCA serves pem as a gateway's /ca.crt; an empty pem answers 404 as
// a gateway with --tls-cert does.
func serveCA(t *testing.T, pem []byte) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ca.crt" || len(pem) == 0 {
			http.Error(w, "serving certificate from --tls-cert", http.StatusNotFound)
			return
		}
		w.Write(pem)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestCA(t *testing.T) {
	ca1, ca2 := testenv.MustCA(t, "gw CA 1"), testenv.MustCA(t, "gw CA 2")
	gw1, gw1b, gw2 := serveCA(t, ca1.CertPEM), serveCA(t, ca1.CertPEM), serveCA(t, ca2.CertPEM)

	// Replicas sharing a CA: printed once. Replicas with CAs of their
	// own: each printed.
	for _, tc := range []struct {
		gateways string
		want     []string
	}{
		{gw1 + "," + gw1b, []string{"gw CA 1"}},
		{gw1 + "," + gw2 + "," + gw1b, []string{"gw CA 1", "gw CA 2"}},
	} {
		code, out, errOut := runCtl("ca", "--gateway", tc.gateways)
		if code != exitOK || errOut != "" {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		certs, err := certfile.ParseCertificates([]byte(out))
		if err != nil {
			t.Fatalf("output is no PEM bundle: %v\n%s", err, out)
		}
		var got []string
		for _, c := range certs {
			got = append(got, c.Subject.CommonName)
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s: bundle of %q, want %q", tc.gateways, got, tc.want)
		}
	}

	// A gateway without a CA of its own: its reason, exit 1, the others'
	// CAs still printed.
	code, out, errOut := runCtl("ca", "--gateway", gw1+","+serveCA(t, nil))
	if code != exitError || !strings.Contains(errOut, "serving certificate from --tls-cert") || !strings.Contains(out, "BEGIN CERTIFICATE") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Something that is not a certificate.
	if code, _, errOut := runCtl("ca", "--gateway", serveCA(t, []byte("hello"))); code != exitError || !strings.Contains(errOut, "/ca.crt") {
		t.Errorf("garbage: exit %d, stderr %q", code, errOut)
	}
}

func TestCAFromDataDir(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.MustCA(t, "gw CA")
	if _, err := ca.WriteFile(dir, "ca"); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCtl("ca", "--data-dir", dir)
	if code != exitOK || out != string(ca.CertPEM) {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	os.Remove(filepath.Join(dir, "ca.crt"))
	if code, _, errOut := runCtl("ca", "--data-dir", dir); code != exitError || !strings.Contains(errOut, "ca.crt") {
		t.Fatalf("missing ca.crt: exit %d, stderr %q", code, errOut)
	}
}
