package main

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/internal/testenv"
)

// The load generator ("agent") is this program run again inside the edge
// site's namespace (so that every socket it opens is the site's, behind
// its NAT), with agentArg as its first argument and the path of its
// agentConfig as the second. It plays the simulated edges: each is an
// edgetunnel.Client, the edge tunnel of tether-edge, with its own node
// client certificate, its own UDP socket per connection, the real
// keepalives, reconnect backoff and stream protocol. Relayed connections
// are answered by a stand-in kubelet in this process (standInKubelet), and
// with the scrape phase those to pods by a /metrics server (podMetrics). The
// parent drives it over HTTP on a unix socket (agentServer).
const agentArg = "__scalebench_agent"

// agentConfig is what the parent hands the agent, as a JSON file.
type agentConfig struct {
	Socket string `json:"socket"` // unix socket of the control server
	Edges  int    `json:"edges"`  // edge-1 .. edge-<Edges>
	// PEM of the CAs: the cluster CA signs the node client certificates,
	// the kubelet CA the stand-in kubelets' serving certificates; the
	// gateway CA verifies the gateways.
	ClusterCACert, ClusterCAKey []byte
	KubeletCACert, KubeletCAKey []byte
	GatewayCACert               []byte
	LogLevel                    string `json:"logLevel"`
	// ScrapePods, with the scrape phase, is --scrape-pods: every edge
	// then knows its pod range and its pods of scrapeLayout, and serves
	// them /metrics (scrape.go). 0: no pods.
	ScrapePods int `json:"scrapePods"`
}

// edgeName and edgeAddr are simulated edge i's node name and InternalIP:
// edgeBase + i, inside the gateways' --edge-cidrs.
func edgeName(i int) string { return fmt.Sprintf("edge-%d", i) }

func edgeAddr(i int) netip.Addr { return addrAt(edgeBase, i) }

func addrAt(base netip.Addr, i int) netip.Addr {
	b := base.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// poolOf is the pool of edge i: pools of poolSize consecutive edges.
func poolOf(i int) string { return fmt.Sprintf("pool-%d", (i-1)/poolSize) }

const poolSize = 10

func runAgent(configPath string) error {
	b, err := os.ReadFile(configPath)
	if err != nil {
		return err
	}
	var cfg agentConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("agent config: %w", err)
	}
	raiseFileLimit(cfg.Edges*4 + 4096)
	level := slog.LevelError
	level.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	a, err := newAgent(cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("unix", cfg.Socket)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: a.mux(), ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(ln) // until the parent kills the process
}

type agent struct {
	log     *slog.Logger
	gwRoots *x509.CertPool
	kubelet *standInKubelet
	metrics *podMetrics // nil without pods
	edges   []*simEdge  // index i-1 for edge-i

	mu sync.Mutex // start and stop
}

// simEdge is one simulated edge node.
type simEdge struct {
	i    int
	name string
	addr netip.Addr
	cert *tls.Certificate
	pods *staticPods // nil without pods

	client *edgetunnel.Client // nil while stopped
	cancel context.CancelFunc
	done   chan struct{}
}

func newAgent(cfg agentConfig, log *slog.Logger) (*agent, error) {
	cluster, err := parseCA(cfg.ClusterCACert, cfg.ClusterCAKey)
	if err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	kubeletCA, err := parseCA(cfg.KubeletCACert, cfg.KubeletCAKey)
	if err != nil {
		return nil, fmt.Errorf("kubelet CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(cfg.GatewayCACert) {
		return nil, errors.New("gateway CA: no certificate")
	}
	a := &agent{log: log, gwRoots: roots, edges: make([]*simEdge, cfg.Edges)}
	if a.kubelet, err = startStandInKubelet(kubeletCA); err != nil {
		return nil, err
	}
	var pods []*staticPods
	if cfg.ScrapePods > 0 {
		if a.metrics, err = startPodMetrics(); err != nil {
			return nil, err
		}
		pods = edgePods(cfg.Edges, cfg.ScrapePods)
	}
	// Every edge's own node client certificate (CN=system:node:edge-<i>,
	// O=system:nodes) and its stand-in kubelet's serving certificate (one
	// key for all of those), issued up front so that neither a cold start
	// nor a routing measurement times this.
	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	var g errgroup.Group
	g.SetLimit(runtime.NumCPU())
	for i := 1; i <= cfg.Edges; i++ {
		g.Go(func() error {
			kp, err := cluster.NodeCert(edgeName(i))
			if err != nil {
				return err
			}
			e := &simEdge{i: i, name: edgeName(i), addr: edgeAddr(i), cert: &kp.TLS}
			if pods != nil {
				e.pods = pods[i-1]
			}
			a.edges[i-1] = e
			return a.kubelet.issue(e.addr, servingKey)
		})
	}
	return a, g.Wait()
}

func parseCA(certPEM, keyPEM []byte) (*testenv.CA, error) {
	kp, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil {
		return nil, err
	}
	key, ok := kp.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("key cannot sign")
	}
	return &testenv.CA{Cert: cert, Key: key, CertPEM: certPEM}, nil
}

// fixedAddrs is a simulated edge's only address, its InternalIP: the
// edge's allow list accepts relayed connections to it (the stand-in
// kubelet then answers them).
type fixedAddrs []netip.Addr

func (f fixedAddrs) Addrs() ([]netip.Addr, error) { return f, nil }

// startEdges starts the stopped edges among idx, dialling gateways.
func (a *agent) startEdges(idx []int, gateways []string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, i := range idx {
		if i < 1 || i > len(a.edges) {
			return fmt.Errorf("no edge %d (1..%d)", i, len(a.edges))
		}
		e := a.edges[i-1]
		if e.client != nil {
			continue
		}
		var pods edgetunnel.PodSource // a nil *staticPods is no nil interface
		if e.pods != nil {
			pods = e.pods
		}
		c, err := edgetunnel.New(edgetunnel.Options{
			Gateways:    gateways,
			RootCAs:     func() *x509.CertPool { return a.gwRoots },
			Certificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return e.cert, nil },
			AllowPorts:  []uint16{world.KubeletPort},
			LocalAddrs:  fixedAddrs{e.addr},
			Pods:        pods,
			Dialer:      edgeDialer{kubelet: a.kubelet, metrics: a.metrics},
			Logger:      a.log.With("node", e.name),
		})
		if err != nil {
			return fmt.Errorf("%s: %w", e.name, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		e.client, e.cancel, e.done = c, cancel, make(chan struct{})
		go func() {
			defer close(e.done)
			c.Run(ctx)
		}()
	}
	return nil
}

// stopEdges stops the running edges among idx and waits until their
// connections are closed (each tells its gateways, as tether-edge does on
// shutdown).
func (a *agent) stopEdges(idx []int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var stopping []*simEdge
	for _, i := range idx {
		if i < 1 || i > len(a.edges) {
			return fmt.Errorf("no edge %d (1..%d)", i, len(a.edges))
		}
		if e := a.edges[i-1]; e.client != nil {
			e.cancel()
			stopping = append(stopping, e)
		}
	}
	for _, e := range stopping {
		<-e.done
		e.client, e.cancel, e.done = nil, nil, nil
	}
	return nil
}

// agentStats is what /stats answers.
type agentStats struct {
	Running    int            `json:"running"`
	Connected  int            `json:"connected"`  // edges with at least one gateway connection
	PerGateway map[string]int `json:"perGateway"` // connected edges by gateway address
	Reconnects int64          `json:"reconnects"`
	// Disconnects: connections that were up and ended, by reason
	// (edgetunnel.Client.Disconnects).
	Disconnects map[string]int64 `json:"disconnects"`
	Relayed     int64            `json:"relayed"` // connections the stand-in kubelet accepted
	Scraped     int64            `json:"scraped"` // pods' /metrics answered (scrape phase)
	Goroutines  int              `json:"goroutines"`
	HeapMiB     float64          `json:"heapMiB"`
}

func (a *agent) stats() agentStats {
	a.mu.Lock()
	var running []*edgetunnel.Client
	for _, e := range a.edges {
		if e.client != nil {
			running = append(running, e.client)
		}
	}
	a.mu.Unlock()
	st := agentStats{Running: len(running), PerGateway: map[string]int{}, Relayed: a.kubelet.accepted.Load(), Goroutines: runtime.NumGoroutine(),
		Disconnects: map[string]int64{}}
	for _, c := range running {
		for reason, n := range c.Disconnects() {
			st.Disconnects[reason] += n
		}
		up := false
		for _, g := range c.Status() {
			st.Reconnects += g.Reconnects
			if g.Connected {
				st.PerGateway[g.Gateway]++
				up = true
			}
		}
		if up {
			st.Connected++
		}
	}
	if a.metrics != nil {
		st.Scraped = a.metrics.served.Load()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st.HeapMiB = float64(ms.HeapInuse) / (1 << 20)
	return st
}

// edgeRequest names edges and, to start them, the gateways they dial.
type edgeRequest struct {
	Edges    []int    `json:"edges"`
	Gateways []string `json:"gateways,omitempty"`
}

func (a *agent) mux() *http.ServeMux {
	m := http.NewServeMux()
	// The load generator's own profiles, for when it is the bottleneck.
	m.HandleFunc("GET /debug/pprof/", pprof.Index)
	m.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	m.HandleFunc("POST /start", func(w http.ResponseWriter, r *http.Request) {
		var req edgeRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		reply(w, nil, a.startEdges(req.Edges, req.Gateways))
	})
	m.HandleFunc("POST /stop", func(w http.ResponseWriter, r *http.Request) {
		var req edgeRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		reply(w, nil, a.stopEdges(req.Edges))
	})
	m.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		reply(w, a.stats(), nil)
	})
	m.HandleFunc("POST /heartbeats", func(w http.ResponseWriter, r *http.Request) {
		var req hbRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		res, err := a.heartbeats(r.Context(), req)
		reply(w, res, err)
	})
	return m
}

func reply(w http.ResponseWriter, v any, err error) {
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// standInKubelet answers the connections the simulated edges' tunnels
// relay, as each node's kubelet on :10250 would: TLS with a serving
// certificate for the node's address (issued on first use by the kubelet
// CA, which the cloud client alone trusts, so that an answer proves the
// request reached the right node through the tunnel), GET /healthz
// answering "ok <address>". It listens on loopback; its dialer remembers
// which node each connection is for by the connection's local port.
type standInKubelet struct {
	ln       net.Listener
	ca       *testenv.CA
	dest     sync.Map // local port of a dialled connection → netip.Addr
	certs    sync.Map // netip.Addr → *tls.Certificate
	accepted atomic.Int64
}

var _ edgetunnel.Dialer = (*standInKubelet)(nil)

func startStandInKubelet(ca *testenv.CA) (*standInKubelet, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("stand-in kubelet: %w", err)
	}
	k := &standInKubelet{ln: ln, ca: ca}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/healthz" {
				http.NotFound(w, r)
				return
			}
			fmt.Fprintf(w, "ok %s\n", r.Host)
		}),
		TLSConfig:         &tls.Config{GetCertificate: k.certificate},
		ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				k.accepted.Add(1)
			}
		},
	}
	go srv.ServeTLS(ln, "", "")
	return k, nil
}

// DialContext connects a relayed connection for address (the node's
// InternalIP and kubelet port) to the stand-in.
func (k *standInKubelet) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	dest, err := netip.ParseAddrPort(address)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", k.ln.Addr().String())
	if err != nil {
		return nil, err
	}
	// Stored before the tunnel's reply goes out, so before the client's
	// ClientHello can arrive.
	k.dest.Store(c.LocalAddr().(*net.TCPAddr).Port, dest.Addr())
	return c, nil
}

// issue makes the serving certificate of addr's stand-in, for key.
func (k *standInKubelet) issue(addr netip.Addr, key *ecdsa.PrivateKey) error {
	certPEM, err := k.ca.IssueFor(testenv.Template{CommonName: addr.String(), Hosts: []string{addr.String()},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, key.Public())
	if err != nil {
		return err
	}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return errors.New("issued certificate is not PEM")
	}
	k.certs.Store(addr, &tls.Certificate{Certificate: [][]byte{block.Bytes}, PrivateKey: key})
	return nil
}

func (k *standInKubelet) certificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	v, ok := k.dest.Load(hello.Conn.RemoteAddr().(*net.TCPAddr).Port)
	if !ok {
		return nil, errors.New("connection of no relayed stream")
	}
	addr := v.(netip.Addr)
	if c, ok := k.certs.Load(addr); ok {
		return c.(*tls.Certificate), nil
	}
	kp, err := k.ca.ServerCert(addr.String(), addr.String())
	if err != nil {
		return nil, err
	}
	c, _ := k.certs.LoadOrStore(addr, &kp.TLS)
	return c.(*tls.Certificate), nil
}
