package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// Konnectivity's ports in the world: proxy-server's frontend (HTTP
// CONNECT, where kube-apiserver's egress selector dials) and agent port
// (gRPC) on the gateway host; the health and admin ports are moved off
// their defaults only where the defaults would collide.
const (
	konnServerPort = 8090
	konnAgentPort  = 8091
	konnHealthPort = 8092
	konnAdminPort  = 8095
	konnAgentAdmin = 8094
	konnAgentHlth  = 8093
)

// konnectivity is apiserver-network-proxy running in the world:
// proxy-server on the gateway host, proxy-agent on the edge host dialling
// it (gRPC over mTLS, the agent-server mode OpenYurt's Raven L7 proxy
// uses), and a dialer that reaches edge addresses through it as
// kube-apiserver's egress selector does in HTTP-CONNECT mode: TLS with a
// client certificate to the frontend, CONNECT host:port, then the
// caller's own TLS end to end inside.
type konnectivity struct {
	server, agent *exec.Cmd
	serverHost    *testenv.Host
	agentHost     *testenv.Host
	client        *testenv.Host
	frontend      string // gateway address:port of the frontend
	tls           *tls.Config
	version       string
}

// buildKonnectivity builds (or finds in the cache) proxy-server and
// proxy-agent with tools/build-konnectivity.sh and returns their directory.
func buildKonnectivity(ctx context.Context) (dir, version string, err error) {
	script := filepath.Join(world.RepoRoot(), "tools", "build-konnectivity.sh")
	cmd := exec.CommandContext(ctx, script)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("%s: %v\n%s", script, err, stderr.String())
	}
	dir = strings.TrimSpace(string(out))
	_, version, _ = strings.Cut(filepath.Base(dir), "konnectivity-")
	return dir, version, nil
}

// startKonnectivity starts proxy-server on gw and proxy-agent on edge with
// certificates of a CA of their own, and waits until a CONNECT through it
// reaches target (host:port on the edge side).
func startKonnectivity(ctx context.Context, s *testenv.Session, binDir, version, dir string, gw, edge, client *testenv.Host, target string) (*konnectivity, error) {
	ca, err := testenv.NewCA("konnectivity-ca")
	if err != nil {
		return nil, err
	}
	caFile, err := ca.WriteFile(dir, "konnectivity-ca")
	if err != nil {
		return nil, err
	}
	// One serving certificate for both of the server's listeners: the
	// agent checks it against --proxy-server-host, the client against
	// the gateway's address.
	srv, err := ca.ServerCert("konnectivity-server", gw.Addr.String())
	if err != nil {
		return nil, err
	}
	agent, err := ca.ClientCert("konnectivity-agent")
	if err != nil {
		return nil, err
	}
	apiserver, err := ca.ClientCert("kube-apiserver")
	if err != nil {
		return nil, err
	}
	srvCert, srvKey, err := srv.WriteFiles(dir, "konnectivity-server")
	if err != nil {
		return nil, err
	}
	agCert, agKey, err := agent.WriteFiles(dir, "konnectivity-agent")
	if err != nil {
		return nil, err
	}
	k := &konnectivity{serverHost: gw, agentHost: edge, client: client, version: version,
		frontend: net.JoinHostPort(gw.Addr.String(), strconv.Itoa(konnServerPort)),
		tls:      &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{apiserver.TLS}, ServerName: gw.Addr.String()},
	}
	k.server = gw.Start(s, filepath.Join(binDir, "proxy-server"),
		"--mode", "http-connect",
		"--server-port", strconv.Itoa(konnServerPort), "--server-bind-address", gw.Addr.String(),
		"--server-cert", srvCert, "--server-key", srvKey, "--server-ca-cert", caFile,
		"--agent-port", strconv.Itoa(konnAgentPort), "--agent-bind-address", gw.Addr.String(),
		"--cluster-cert", srvCert, "--cluster-key", srvKey, "--cluster-ca-cert", caFile,
		"--health-port", strconv.Itoa(konnHealthPort), "--health-bind-address", "127.0.0.1",
		"--admin-port", strconv.Itoa(konnAdminPort),
		"--server-count", "1", "--server-id", "bench-server",
	)
	k.agent = edge.Start(s, filepath.Join(binDir, "proxy-agent"),
		"--proxy-server-host", gw.Addr.String(), "--proxy-server-port", strconv.Itoa(konnAgentPort),
		"--agent-cert", agCert, "--agent-key", agKey, "--ca-cert", caFile,
		"--health-server-host", "127.0.0.1", "--health-server-port", strconv.Itoa(konnAgentHlth),
		"--admin-server-port", strconv.Itoa(konnAgentAdmin),
		"--agent-id", edge.Label,
	)
	if err := k.waitReachable(ctx, target, 30*time.Second); err != nil {
		return nil, err
	}
	return k, nil
}

// logTails is the end of both processes' logs.
func (k *konnectivity) logTails(n int) string {
	return fmt.Sprintf("proxy-server log:\n%s\nproxy-agent log:\n%s",
		indent(lastLines(k.serverHost.Log(k.server), n), "  "), indent(lastLines(k.agentHost.Log(k.agent), n), "  "))
}

func (k *konnectivity) pids() []int { return []int{k.server.Process.Pid, k.agent.Process.Pid} }

// waitReachable retries a CONNECT to target until one succeeds.
func (k *konnectivity) waitReachable(ctx context.Context, target string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := k.DialContext(dctx, "tcp", target)
		dcancel()
		if err == nil {
			c.Close()
			return nil
		}
		for _, p := range []struct {
			h   *testenv.Host
			cmd *exec.Cmd
		}{{k.serverHost, k.server}, {k.agentHost, k.agent}} {
			if p.h.Exited(p.cmd) {
				return fmt.Errorf("konnectivity: %s exited: %s", filepath.Base(p.cmd.Args[4]), lastLines(p.h.Log(p.cmd), 10))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("konnectivity: %s not reachable through proxy-server within %v: %v\nproxy-server log:\n%s\nproxy-agent log:\n%s",
				target, timeout, err, lastLines(k.serverHost.Log(k.server), 10), lastLines(k.agentHost.Log(k.agent), 10))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// DialContext opens a connection to addr on the edge side through
// proxy-server's HTTP-CONNECT frontend, from the client host.
func (k *konnectivity) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := k.client.DialContext(ctx, "tcp", k.frontend)
	if err != nil {
		return nil, err
	}
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	tc := tls.Client(c, k.tls)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("konnectivity frontend: %w", err)
	}
	if _, err := fmt.Fprintf(tc, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: tunnelbench\r\n\r\n", addr, addr); err != nil {
		tc.Close()
		return nil, err
	}
	br := bufio.NewReader(tc)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		tc.Close()
		return nil, fmt.Errorf("konnectivity CONNECT %s: %w", addr, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tc.Close()
		return nil, fmt.Errorf("konnectivity CONNECT %s: %s", addr, resp.Status)
	}
	c.SetDeadline(time.Time{})
	if br.Buffered() > 0 { // the server spoke first (it does not in HTTP/1.1 over TLS)
		return &bufferedConn{Conn: tc, r: br}, nil
	}
	return tc, nil
}

// bufferedConn is a connection whose first bytes were read into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
