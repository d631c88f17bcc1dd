package apiproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/edgeproxy/apiproxy/podcache"
	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/edgeproxy/filter"
	"github.com/tether-edge/tether/edgeproxy/upstream"
	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/testenv"
)

// kubeletUA is the User-Agent of the kubelet-like clients.
const kubeletUA = "kubelet/v1.36.3 (linux/amd64) kubernetes/abc"

// dialer dials and listens somewhere: the test process's namespace
// (hostNet) or a testenv.Host.
type dialer interface {
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
	Listen(network, addr string) (net.Listener, error)
}

type hostNet struct{}

func (hostNet) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func (hostNet) Listen(network, addr string) (net.Listener, error) { return net.Listen(network, addr) }

// edgeSpec is what an in-process tether-edge apiserver proxy runs with.
type edgeSpec struct {
	net     dialer
	server  string // apiserver URL
	node    string
	cert    tls.Certificate
	ca      *testenv.CA
	rootCAs *x509.CertPool // instead of ca's
	dataDir string
	addr    string // listen address; "" picks one
	health  upstream.HealthOptions
	// offline, if set, makes the proxy believe the cloud is unhealthy
	// whatever the probes say (for tests of the offline paths that need
	// no network cut).
	offline *switchable
	// topology runs the service topology filter for
	// DefaultTopologyComponents, its informers reading through the proxy
	// as in edgeproxy.Run.
	topology bool
	// pool, if set, is the node pool the proxy serves from.
	pool Pool
	// components are the cached components (DefaultComponents if nil).
	components []string
	// pods runs the pod listener (TLS, a certificate of ca for
	// 127.0.0.1) at edge.PodAddr, as tether-edge's --pod-api-listen.
	pods bool
	// podService are the addresses the kubelet sees as default/kubernetes'
	// cluster IPs (spec.pods only; none: the Service unchanged).
	podService []string
}

// edge is a running proxy, built from the same packages and in the same
// way as edgeproxy.Run does.
type edge struct {
	t    testing.TB
	spec edgeSpec
	Addr string // 127.0.0.1:port in spec.net
	// PodAddr is the pod listener's address (spec.pods only).
	PodAddr  string
	PodCache *podcache.Cache
	Ups      *upstream.Upstreams
	Store    *cache.Store
	Proxy    *Proxy
	Topo     *filter.Filter // spec.topology only
	Reg      *prometheus.Registry
	cancel   context.CancelFunc
	done     sync.WaitGroup
	logs     *lockedBuffer
	// records are the proxy's log records, for tests of what an
	// operator is told.
	records *logRecords
}

func startEdge(t testing.TB, spec edgeSpec) *edge {
	t.Helper()
	if spec.health.Interval == 0 {
		spec.health = upstream.HealthOptions{Interval: 300 * time.Millisecond, Timeout: time.Second, FailureThreshold: 3, SuccessThreshold: 2}
	}
	if spec.dataDir == "" {
		spec.dataDir = t.TempDir()
	}
	e := &edge{t: t, spec: spec, Reg: prometheus.NewRegistry(), logs: &lockedBuffer{}, records: &logRecords{}}
	log := slog.New(slog.NewMultiHandler(
		slog.NewTextHandler(io.MultiWriter(e.logs, testWriter(t)), &slog.HandlerOptions{Level: slog.LevelDebug}), e.records))
	roots := spec.rootCAs
	if roots == nil {
		roots = spec.ca.Pool()
	}
	var err error
	e.Ups, err = upstream.New(upstream.Options{
		Servers:     []string{spec.server},
		TLS:         &tls.Config{Certificates: []tls.Certificate{spec.cert}, RootCAs: roots},
		DialContext: spec.net.DialContext,
		PingAfter:   time.Second, PingTimeout: time.Second,
		Health:     spec.health,
		Logger:     log.With("part", "upstream"),
		Registerer: e.Reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	if e.Store, err = cache.Open(filepath.Join(spec.dataDir, cache.FileName), log); err != nil {
		t.Fatal(err)
	}
	var up Upstream = e.Ups
	if spec.offline != nil {
		spec.offline.Upstream = e.Ups
		up = spec.offline
	}
	addr := spec.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	testenv.EventuallyNoError(t, "the listen address", func() (err error) { // after a restart the port may take a moment
		ln, err = spec.net.Listen("tcp", addr)
		return err
	})
	e.Addr = ln.Addr().String()
	var topo Topology
	var loop *Loopback
	if spec.topology {
		// The filter's informers read through the proxy in process.
		loop = NewLoopback(TopologyClient)
		_, cfg := e.client(TopologyUserAgent + "/test")
		cfg.Dial, cfg.Transport = nil, loop
		c, err := kube.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		e.Topo = filter.New(spec.node, c)
		topo = e.Topo
	}
	components := spec.components
	if components == nil {
		components = DefaultComponents
	}
	var pods *PodOptions
	var podLn net.Listener
	if spec.pods {
		if e.PodCache, err = podcache.Open(filepath.Join(spec.dataDir, podcache.FileName), podcache.Options{Logger: log}); err != nil {
			t.Fatal(err)
		}
		pods = &PodOptions{Transport: e.Ups.PodTransport(), Cache: e.PodCache}
		kp, err := spec.ca.ServerCert("pod-api", "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if podLn, err = spec.net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		e.PodAddr = podLn.Addr().String()
		pods.Addresses, pods.Port = spec.podService, int32(podLn.Addr().(*net.TCPAddr).Port)
		podLn = tls.NewListener(podLn, &tls.Config{Certificates: []tls.Certificate{kp.TLS}, NextProtos: []string{"h2", "http/1.1"}})
	}
	e.Proxy, err = New(Options{Upstream: up, Store: e.Store, NodeName: spec.node, Components: components,
		HeldWatchRecheck: 2 * time.Second, ReleaseJitter: 100 * time.Millisecond,
		Logger: log.With("part", "apiproxy"), Registerer: e.Reg, Topology: topo, TopologyComponents: DefaultTopologyComponents, Pool: spec.pool,
		Pods: pods})
	if err != nil {
		t.Fatal(err)
	}
	if loop != nil {
		loop.Bind(e.Proxy)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	if e.Topo != nil {
		e.Topo.Start(ctx)
	}
	runs := []func(context.Context) error{
		e.Ups.Run, e.Proxy.Run, func(ctx context.Context) error { return e.Proxy.Serve(ctx, ln) },
	}
	if podLn != nil {
		runs = append(runs, func(ctx context.Context) error { return e.Proxy.ServePods(ctx, podLn) })
	}
	for _, run := range runs {
		e.done.Add(1)
		go func() {
			defer e.done.Done()
			if err := run(ctx); err != nil {
				t.Errorf("edge: %v", err)
			}
		}()
	}
	t.Cleanup(e.stop)
	return e
}

// stop ends the proxy and closes its store (idempotent).
func (e *edge) stop() {
	if e.cancel == nil {
		return
	}
	e.cancel()
	e.done.Wait()
	if e.Topo != nil {
		e.Topo.Shutdown()
	}
	// The upstream transports keep idle connections to the apiserver for
	// reuse, as the process would until it exits: closed here, as a test
	// closes its HTTP clients' idle connections (new transports in their
	// place stay empty). Busy ones stay open until their requests end.
	e.Ups.Rotate()
	if e.spec.offline != nil {
		e.spec.offline.release()
	}
	e.Store.Close()
	if e.PodCache != nil {
		e.PodCache.Close()
	}
	e.cancel = nil
}

// restart stops the proxy and starts another on the same data dir and
// address, as a restarted tether-edge would be.
func (e *edge) restart() *edge {
	e.stop()
	spec := e.spec
	spec.addr = e.Addr
	return startEdge(e.t, spec)
}

// client is a client of the proxy with a component's User-Agent, talking
// plain HTTP to the proxy as kubelet does; it uses client-go's defaults
// (protobuf for built-in types, watch-list informers).
func (e *edge) client(userAgent string) (kubernetes.Interface, *rest.Config) {
	cfg := &rest.Config{Host: "http://" + e.Addr, UserAgent: userAgent, Dial: e.spec.net.DialContext, QPS: 200, Burst: 400}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return c, cfg
}

// metric reads one series of the proxy's metrics.
func (e *edge) metric(name string, labels ...string) float64 {
	e.t.Helper()
	mfs, err := e.Reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metric
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// waitHealthy waits until the proxy's view of the cloud is want.
func (e *edge) waitHealthy(want bool, within time.Duration) time.Duration {
	e.t.Helper()
	start := time.Now()
	testenv.EventuallyWithin(e.t, within, fmt.Sprintf("the cloud's health to be %v", want), func() bool {
		return e.Proxy.up.Healthy() == want
	})
	return time.Since(start)
}

// switchable is an Upstream whose health can be forced to unhealthy.
type switchable struct {
	Upstream
	mu      sync.Mutex
	down    bool
	changed chan struct{}
}

func (s *switchable) set(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	if s.down != down {
		s.down = down
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

// release wakes whoever waits on Changed, for good: the proxy has
// stopped, and the goroutines Changed started end.
func (s *switchable) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

func (s *switchable) Healthy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.down && s.Upstream.Healthy()
}

func (s *switchable) Server() (*url.URL, bool) {
	u, ok := s.Upstream.Server()
	return u, ok && s.Healthy()
}

func (s *switchable) Changed() <-chan struct{} {
	s.mu.Lock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	mine := s.changed
	s.mu.Unlock()
	theirs := s.Upstream.Changed()
	out := make(chan struct{})
	go func() {
		select {
		case <-mine:
		case <-theirs:
		}
		close(out)
	}()
	return out
}

// lockedBuffer is a log sink tests can search.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// logRecords is a slog.Handler that keeps the records it is given.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }

func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}

// find returns the attributes, as strings, of the records of level
// with message msg.
func (l *logRecords) find(level slog.Level, msg string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var found []map[string]string
	for _, r := range l.recs {
		if r.Level != level || r.Message != msg {
			continue
		}
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		found = append(found, attrs)
	}
	return found
}

// testWriter sends logs to stderr when TETHER_TEST_LOGS is set.
func testWriter(testing.TB) io.Writer {
	if os.Getenv("TETHER_TEST_LOGS") != "" {
		return os.Stderr
	}
	return io.Discard
}
