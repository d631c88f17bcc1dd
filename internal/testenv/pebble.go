package testenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// PebbleOptions configures StartPebble.
type PebbleOptions struct {
	// HTTPPort is the port Pebble's validation authority dials for HTTP-01
	// challenges, on the address the name resolves to (Hosts): where the
	// gateway's challenge listener must be. Required.
	HTTPPort int
	// Hosts are the A records of Pebble's resolver (a DNS server on
	// loopback that the test owns): name -> IPv4 address. Names outside
	// it get NXDOMAIN. Pebble.SetHost changes them later.
	Hosts map[string]string
	// CertValidity is how long the certificates Pebble issues live; 0
	// means Pebble's default (90 days). Short lifetimes test renewal.
	CertValidity time.Duration
}

// Pebble is a running Pebble ACME server (from Binaries) on loopback, with
// real HTTP-01 validation (PEBBLE_VA_ALWAYS_VALID is never set) against the
// addresses of its own DNS server. Its ACME API is HTTPS with a
// certificate of a test CA (ServerCAFile); the certificates it issues chain
// to a root it generates at start (IssuingRoots).
type Pebble struct {
	// DirectoryURL is the ACME directory, https://127.0.0.1:<port>/dir.
	DirectoryURL string
	// ServerCAFile is a PEM file with the CA of Pebble's own HTTPS
	// certificate (the gateway's --acme-ca-root); ServerCA is the same as
	// a pool.
	ServerCAFile string
	ServerCA     *x509.CertPool
	// LogFile is Pebble's log (its stdout and stderr).
	LogFile string

	mgmtURL string
	mu      sync.Mutex
	hosts   map[string]string
}

// StartPebble starts Pebble and its DNS server on loopback and returns once
// the ACME directory answers. The registered cleanup stops both.
func StartPebble(t T, opts PebbleOptions) *Pebble {
	t.Helper()
	bins := Binaries(t)
	p, err := startPebble(t, bins.Pebble, opts)
	if err != nil {
		t.Fatalf("start pebble: %v", err)
	}
	t.Logf("pebble ready at %s (validates HTTP-01 on port %d, log %s)", p.DirectoryURL, opts.HTTPPort, p.LogFile)
	return p
}

func startPebble(t T, bin string, opts PebbleOptions) (*Pebble, error) {
	if opts.HTTPPort <= 0 {
		return nil, fmt.Errorf("no HTTPPort")
	}
	dir, err := os.MkdirTemp("", "tether-pebble-")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &Pebble{hosts: map[string]string{}, LogFile: filepath.Join(dir, "pebble.log")}
	for name, ip := range opts.Hosts {
		p.SetHost(name, ip)
	}

	// Pebble's resolver, on UDP and TCP (Pebble asks over TCP), on one
	// port: the port UDP got may be taken for TCP (an outgoing
	// connection's), so another is tried then.
	var pc net.PacketConn
	var ln net.Listener
	for attempt := 0; ; attempt++ {
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("DNS listener: %w", err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 20 {
			return nil, fmt.Errorf("DNS listener: %w", err)
		}
	}
	for _, srv := range []*dns.Server{
		{PacketConn: pc, Handler: dns.HandlerFunc(p.serveDNS)},
		{Listener: ln, Handler: dns.HandlerFunc(p.serveDNS)},
	} {
		go srv.ActivateAndServe()
		t.Cleanup(func() { srv.Shutdown() })
	}

	// Pebble's HTTPS certificate, from a CA of the test.
	ca, err := NewCA("pebble-test-ca")
	if err != nil {
		return nil, err
	}
	if p.ServerCAFile, err = ca.WriteFile(dir, "server-ca"); err != nil {
		return nil, err
	}
	p.ServerCA = ca.Pool()
	serving, err := ca.ServerCert("pebble", "127.0.0.1", "localhost")
	if err != nil {
		return nil, err
	}
	certFile, keyFile, err := serving.WriteFiles(dir, "pebble")
	if err != nil {
		return nil, err
	}

	ports, err := freeLoopbackPorts(3)
	if err != nil {
		return nil, err
	}
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	mgmt := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	p.DirectoryURL = "https://" + listen + "/dir"
	p.mgmtURL = "https://" + mgmt
	var conf struct {
		Pebble map[string]any `json:"pebble"`
	}
	profile := map[string]any{"description": "tether tests"}
	if opts.CertValidity > 0 {
		profile["validityPeriod"] = int64(opts.CertValidity / time.Second)
	}
	conf.Pebble = map[string]any{
		"listenAddress":           listen,
		"managementListenAddress": mgmt,
		"certificate":             certFile,
		"privateKey":              keyFile,
		"httpPort":                opts.HTTPPort,
		"tlsPort":                 ports[2],
		"keyAlgorithm":            "ecdsa",
		"profiles":                map[string]any{"default": profile},
	}
	confJSON, err := json.Marshal(conf)
	if err != nil {
		return nil, err
	}
	confFile := filepath.Join(dir, "pebble-config.json")
	if err := os.WriteFile(confFile, confJSON, 0o600); err != nil {
		return nil, err
	}

	logf, err := os.Create(p.LogFile)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-config", confFile, "-dnsserver", pc.LocalAddr().String())
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = pebbleEnv()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(componentStopGrace):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})

	client := p.client()
	deadline := time.Now().Add(readyTimeout)
	for {
		resp, err := client.Get(p.DirectoryURL)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("pebble exited:\n%s", p.Log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("directory %s not ready after %v: %v\n%s", p.DirectoryURL, readyTimeout, err, p.Log())
		}
	}
}

// pebbleEnv is the test process's environment for Pebble: validations at
// full speed (PEBBLE_VA_NOSLEEP), no nonces rejected at random, no reuse of
// earlier authorizations (every order is validated for real), and never
// PEBBLE_VA_ALWAYS_VALID.
func pebbleEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PEBBLE_") {
			env = append(env, kv)
		}
	}
	return append(env, "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0")
}

// SetHost makes Pebble's resolver answer name with the IPv4 address ip
// (an empty ip removes the name).
func (p *Pebble) SetHost(name, ip string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	name = dns.CanonicalName(name)
	if ip == "" {
		delete(p.hosts, name)
		return
	}
	p.hosts[name] = ip
}

func (p *Pebble) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) == 1 {
		q := req.Question[0]
		p.mu.Lock()
		ip, ok := p.hosts[dns.CanonicalName(q.Name)]
		p.mu.Unlock()
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 0},
				A:   net.ParseIP(ip).To4(),
			})
		}
	}
	w.WriteMsg(m)
}

func (p *Pebble) client() *http.Client {
	return &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.ServerCA}},
	}
}

// IssuingRoots returns the root of the certificates Pebble issues (from its
// management interface, /roots/0): what a client of a Pebble-issued
// certificate verifies it against.
func (p *Pebble) IssuingRoots(t T) *x509.CertPool {
	t.Helper()
	resp, err := p.client().Get(p.mgmtURL + "/roots/0")
	if err != nil {
		t.Fatalf("pebble root: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("pebble root: %s %v: %s", resp.Status, err, body)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(body) {
		t.Fatalf("pebble root: no certificate in %q", body)
	}
	return pool
}

// Log returns what Pebble has logged so far.
func (p *Pebble) Log() string {
	b, _ := os.ReadFile(p.LogFile)
	return string(b)
}

var (
	pebbleIssuedRE   = regexp.MustCompile(`Issued certificate serial (\S+) for order`)
	pebbleAccountsRE = regexp.MustCompile(`There are now (\d+) accounts in memory`)
)

// Issued returns the serial numbers (hex) of the certificates Pebble has
// issued, in order, from its log.
func (p *Pebble) Issued() []string {
	var serials []string
	for _, m := range pebbleIssuedRE.FindAllStringSubmatch(p.Log(), -1) {
		serials = append(serials, m[1])
	}
	return serials
}

// Accounts returns how many ACME accounts Pebble has registered.
func (p *Pebble) Accounts() int {
	n := 0
	for _, m := range pebbleAccountsRE.FindAllStringSubmatch(p.Log(), -1) {
		n, _ = strconv.Atoi(m[1])
	}
	return n
}

// WaitIssued waits until Pebble has issued at least n certificates.
func (p *Pebble) WaitIssued(ctx context.Context, n int) ([]string, error) {
	for {
		if s := p.Issued(); len(s) >= n {
			return s, nil
		}
		select {
		case <-ctx.Done():
			return p.Issued(), fmt.Errorf("pebble issued %d certificates, want %d: %w", len(p.Issued()), n, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freeLoopbackPorts returns n TCP ports free on 127.0.0.1 right now.
func freeLoopbackPorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// FreeLoopbackPort returns a TCP port free on 127.0.0.1 right now, such as
// the HTTP-01 port to give StartPebble and a challenge listener.
func FreeLoopbackPort(t T) int {
	t.Helper()
	ports, err := freeLoopbackPorts(1)
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return ports[0]
}
