package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/testenv"
)

func TestHysteresis(t *testing.T) {
	h := hysteresis{failureThreshold: 3, successThreshold: 2}
	steps := []struct {
		ok               bool
		changed, healthy bool
	}{
		{true, true, true}, // the first result sets the state
		{false, false, true},
		{false, false, true},
		{true, false, true}, // a success resets the count of failures
		{false, false, true},
		{false, false, true},
		{false, true, false}, // third failure in a row
		{true, false, false},
		{false, false, false}, // a failure resets the count of successes
		{true, false, false},
		{true, true, true}, // second success in a row
	}
	for i, s := range steps {
		changed := h.observe(s.ok)
		if changed != s.changed || h.healthy != s.healthy {
			t.Fatalf("step %d (ok=%v): changed %v healthy %v, want %v %v", i, s.ok, changed, h.healthy, s.changed, s.healthy)
		}
	}
	first := hysteresis{failureThreshold: 3, successThreshold: 2}
	if !first.observe(false) || first.healthy || !first.known {
		t.Error("a first failure does not make the state known unhealthy")
	}
}

// The loop probes once at start, then only on ticks and kicks.
func TestProbeLoopFollowsTheClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	probes := make(chan chan error)
	results := make(chan error, 10)
	decisions := make(chan bool, 10)
	kick := make(chan struct{}, 1)
	go probeLoop(ctx, clk, 2*time.Second, 2, kick,
		func(ctx context.Context) error {
			reply := make(chan error)
			probes <- reply
			return <-reply
		},
		func(err error) { results <- err },
		func(started bool) { decisions <- started })

	next := func(what string) chan error {
		t.Helper()
		select {
		case p := <-probes:
			return p
		case <-time.After(testenv.WaitBound):
			t.Fatalf("no probe %s", what)
			return nil
		}
	}
	// decision waits for the loop's decision on a tick or kick: a probe
	// started or not. The loop decides before it looks at anything else,
	// so no later event can hide a wrong one.
	decision := func(what string, want bool) {
		t.Helper()
		select {
		case got := <-decisions:
			if got != want {
				t.Fatalf("%s: a probe started %v, want %v", what, got, want)
			}
		case <-time.After(testenv.WaitBound):
			t.Fatalf("%s: no decision", what)
		}
	}
	p := next("at start")
	p <- nil
	if err := <-results; err != nil {
		t.Fatal(err)
	}
	// The loop handled the result after anything that came before it: a
	// decision made before a tick would be waiting here.
	select {
	case started := <-decisions:
		t.Fatalf("a decision (probe started: %v) before any tick or kick", started)
	default:
	}
	testenv.Eventually(t, "the loop's ticker", clk.HasWaiters)
	clk.Step(2 * time.Second)
	decision("on the tick", true)
	p1 := next("on the tick")
	// The probe hangs (dead server): the next tick starts a second one,
	// the one after that none (maxInflight 2), a kick none either.
	clk.Step(2 * time.Second)
	decision("on the second tick", true)
	p2 := next("on the second tick")
	clk.Step(2 * time.Second)
	decision("on the third tick, two probes running", false)
	kick <- struct{}{}
	decision("on a kick, two probes running", false)
	p1 <- errors.New("timeout")
	p2 <- errors.New("timeout")
	<-results
	<-results
	kick <- struct{}{}
	decision("on a kick, none running", true)
	next("on a kick") <- nil
	<-results
}

func TestUpstreamsHealth(t *testing.T) {
	var status atomic.Int32
	var delay, slow atomic.Int64
	status.Store(200)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		d := time.Duration(delay.Load())
		time.Sleep(d)
		w.WriteHeader(int(status.Load()))
		if d > 0 {
			slow.Add(1)
		}
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	u, err := New(Options{
		Servers: []string{"https://127.0.0.1:1", srv.URL}, // the first never answers
		TLS:     &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs},
		Health:  HealthOptions{Interval: 20 * time.Millisecond, Timeout: 5 * time.Second, FailureThreshold: 3, SuccessThreshold: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go u.Run(ctx)
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	u.WaitKnown(wctx)
	wcancel()
	waitFor := func(want bool) {
		t.Helper()
		testenv.Eventually(t, fmt.Sprintf("healthy %v", want), func() bool { return u.Healthy() == want })
	}
	second := func() statusapi.Upstream {
		for _, st := range u.Status() {
			if st.Server == srv.URL {
				return st
			}
		}
		t.Fatalf("no status of %s: %+v", srv.URL, u.Status())
		return statusapi.Upstream{}
	}
	waitFor(true)
	if s, ok := u.Server(); !ok || s.Host != srv.Listener.Addr().String() {
		t.Errorf("Server() = %v, %v: want the healthy second server", s, ok)
	}
	// Slow but answering within the timeout: stays healthy, through
	// twice the failure threshold of slow probes answered and observed.
	changed := u.Changed()
	before := second().Probes
	delay.Store(int64(200 * time.Millisecond))
	testenv.Eventually(t, "6 slow probes answered", func() bool { return slow.Load() >= 6 })
	answered := uint64(slow.Load())
	testenv.Eventually(t, "the slow probes observed", func() bool { return second().Probes >= before+answered })
	select {
	case <-changed:
		t.Fatalf("a slow server was declared unhealthy: %+v", u.Status())
	default:
	}
	if st := second(); st.LastError != "" || !st.Healthy {
		t.Fatalf("a slow server's probe failed: %+v", st)
	}
	delay.Store(0)
	status.Store(500)
	waitFor(false)
	if _, ok := u.Server(); ok {
		t.Error("Server() says healthy")
	}
	if u.Ready() == nil {
		t.Error("Ready while no server is healthy")
	}
	status.Store(200)
	waitFor(true)
}

// TestRotate: after Rotate, new requests go over a new connection with the
// client certificate of the moment, while a request in flight (a watch)
// goes on over the old one.
func TestRotate(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
		case "/who":
			fmt.Fprint(w, r.TLS.PeerCertificates[0].Subject.CommonName)
		case "/watch":
			for i := 0; r.Context().Err() == nil; i++ {
				fmt.Fprintf(w, "event %d\n", i)
				w.(http.Flusher).Flush()
				time.Sleep(20 * time.Millisecond)
			}
		}
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	srv.StartTLS()
	defer srv.Close()

	u, use := withClientCert(t, srv)
	use("first")
	client := &http.Client{Transport: u.Transport()}
	get := func(path string) *http.Response {
		t.Helper()
		resp, err := client.Get(srv.URL + path)
		if err != nil || resp.ProtoMajor != 2 {
			t.Fatalf("GET %s: %v, %v", path, resp, err)
		}
		return resp
	}
	who := func() string {
		t.Helper()
		resp := get("/who")
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	watch := get("/watch")
	defer watch.Body.Close()
	events := bufio.NewScanner(watch.Body)
	events.Scan()
	if got := who(); got != "first" {
		t.Fatalf("before Rotate: %q", got)
	}

	use("second")
	if got := who(); got != "first" {
		t.Errorf("without Rotate, requests share the connection made with the first certificate; got %q", got)
	}
	u.Rotate()
	if got := who(); got != "second" {
		t.Errorf("after Rotate: %q, want the second certificate", got)
	}
	for range 5 {
		if !events.Scan() {
			t.Fatalf("the watch ended at the rotation: %v", events.Err())
		}
	}
}

// withClientCert returns Upstreams for srv that present a client
// certificate of the name last given to use.
func withClientCert(t *testing.T, srv *httptest.Server) (u *Upstreams, use func(cn string)) {
	t.Helper()
	ca := testenv.MustCA(t, "upstream-test")
	var cert atomic.Pointer[tls.Certificate]
	use = func(cn string) {
		kp, err := ca.ClientCert(cn)
		if err != nil {
			t.Fatal(err)
		}
		cert.Store(&kp.TLS)
	}
	u, err := New(Options{
		Servers: []string{srv.URL},
		TLS: &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert.Load(), nil }},
	})
	if err != nil {
		t.Fatal(err)
	}
	return u, use
}

// TestPodTransportNoClientCert: the pods' transport shows the server no
// client certificate and adds no credential of the node, whatever the
// node's transports present; the pod's own Authorization header passes.
func TestPodTransportNoClientCert(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cn := "none"
		if len(r.TLS.PeerCertificates) > 0 {
			cn = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		fmt.Fprintf(w, "%s|%s", cn, r.Header.Get("Authorization"))
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	defer srv.Close()
	ca := testenv.MustCA(t, "upstream-test")
	kp, err := ca.ClientCert("system:node:edge-1", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	for _, o := range []Options{
		{TLS: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{kp.TLS}}},
		{TLS: &tls.Config{RootCAs: roots, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &kp.TLS, nil }}},
		{TLS: &tls.Config{RootCAs: roots}, BearerToken: "node-token"},
	} {
		o.Servers = []string{srv.URL}
		u, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		ask := func(rt http.RoundTripper, auth string, upgrade bool) string {
			t.Helper()
			req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/v1/namespaces/a/configmaps", nil)
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			if upgrade {
				req.Header.Set("Connection", "Upgrade")
				req.Header.Set("Upgrade", "SPDY/3.1")
			}
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return string(b)
		}
		if got := ask(u.Transport(), "", false); got == "none|" {
			t.Fatalf("the node's transport presents no credential (%q): the test proves nothing", got)
		}
		for _, upgrade := range []bool{false, true} {
			if got := ask(u.PodTransport(), "Bearer pod-token", upgrade); got != "none|Bearer pod-token" {
				t.Errorf("pod transport (upgrade %v): the server saw %q, want no client certificate and the pod's token", upgrade, got)
			}
			if got := ask(u.PodTransport(), "", upgrade); got != "none|" {
				t.Errorf("pod transport without a token (upgrade %v): the server saw %q, want no credential", upgrade, got)
			}
		}
		u.PodTransport().(*podTransport).h2.CloseIdleConnections()
		u.PodTransport().(*podTransport).h1.CloseIdleConnections()
		u.Rotate()
	}
}
