package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

const (
	namespace     = "soak"
	stepCondition = "tether.soak/Step"
	kubeletUA     = "kubelet/v1.36.3 (linux/amd64) kubernetes/soak"
)

// run builds the world, warms it up, soaks it and checks the end state.
func run(ctx context.Context, s *testenv.Session, o options) (*report, error) {
	note := func(format string, args ...any) { benchkit.Note(os.Stdout, "soak", false, format, args...) }
	bins, err := world.BenchBinaries(s, o.binDir, note, "tether-gateway", "tether-edge")
	if err != nil {
		return nil, err
	}
	note("building the world: kube-apiserver, a gateway, one edge site behind NAT")
	w := world.New(s, bins, world.Options{Sites: []testenv.SiteSpec{
		{Name: "site-a", Hosts: []string{"edge-1"}, LAN: netip.MustParsePrefix("192.168.1.0/24")},
	}}, s.Logf)
	w.ApplyEdgeRBAC(s)
	gw, e := w.Gateways[0], w.Edges[0]
	pods, err := createPods(ctx, w.CP.Client, e.Name, o.pods)
	if err != nil {
		return nil, err
	}
	w.StartGateway(s, gw)
	w.RouteSitesVia(s, gw)
	w.StartEdge(s, e, w.ProxyArgs(e)...)
	if err := w.WaitReachable(ctx, 60*time.Second); err != nil {
		return nil, err
	}

	r := &report{start: time.Now(), pods: len(pods)}
	k := &kubelet{c: e.ProxyClient(kubeletUA), node: e.Name, pods: pods, acked: map[string]int{}, sent: map[string]int{}}
	relay := newRelay(w, e)

	note("warming up: 2,000 relayed connections and 500 kubelet requests")
	if err := warmUp(ctx, relay, k, o.relayConc); err != nil {
		return r, fmt.Errorf("warm-up: %w", err)
	}
	if r.gwWarm, err = sample(ctx, w.Client, world.GatewayAdmin(gw, "/metrics")); err != nil {
		return r, err
	}
	if r.edgeWarm, err = sample(ctx, e.Host, world.EdgeAdmin("/metrics")); err != nil {
		return r, err
	}

	note("soaking for up to %v: %d connections, %d kubelet requests; uplink cut/healed every %v, tether-edge killed every %v",
		o.duration, o.connections, o.requests, o.cutEvery, o.killEvery)
	soakCtx, stopSoak := context.WithTimeout(ctx, o.duration)
	defer stopSoak()
	var wg sync.WaitGroup
	var relayDone, kubeletDone atomic.Bool
	// Only answered connections and requests count toward the targets; a
	// failure (the uplink is cut, tether-edge restarts) waits a moment, so
	// that a fast refusal does not spin.
	pause := func() { benchkit.Sleep(soakCtx, 100*time.Millisecond) }
	for range o.relayConc {
		wg.Go(func() {
			for soakCtx.Err() == nil && relay.ok.Load() < int64(o.connections) {
				if relay.once(soakCtx) != nil {
					pause()
				}
			}
		})
	}
	go func() { wg.Wait(); relayDone.Store(true) }()
	// The kubelet's answered requests are paced evenly over --duration
	// (behind, it catches up at full speed), so that every cut and kill
	// lands while it makes them.
	var kwg sync.WaitGroup
	kwg.Go(func() {
		base, start := k.ok.Load(), time.Now()
		every := o.duration / time.Duration(max(o.requests, 1))
		for i := 0; soakCtx.Err() == nil && k.ok.Load()-base < int64(o.requests); i++ {
			if wait := time.Until(start.Add(time.Duration(k.ok.Load()-base) * every)); wait > 0 && benchkit.Sleep(soakCtx, wait) != nil {
				continue
			}
			if k.once(soakCtx, i) != nil {
				pause()
			}
		}
		kubeletDone.Store(true)
	})
	progress := time.NewTicker(15 * time.Second)
	defer progress.Stop()
	cut := tickerOrNil(o.cutEvery)
	kill := tickerOrNil(o.killEvery)
	site := e.Site
	cutNow := false
	var logs []string // the logs of the tether-edge processes killed
	for !(relayDone.Load() && kubeletDone.Load()) && soakCtx.Err() == nil {
		select {
		case <-soakCtx.Done():
		case <-progress.C:
			note("%v: %d/%d connections ok, %d/%d kubelet requests ok, %d cuts, %d kills",
				time.Since(r.start).Round(time.Second), relay.ok.Load(), relay.tried.Load(), k.ok.Load(), k.tried.Load(), r.cuts, r.kills)
		case <-tickC(cut):
			if cutNow {
				site.Heal()
			} else {
				site.Cut()
				r.cuts++
			}
			cutNow = !cutNow
		case <-tickC(kill):
			logs = append(logs, w.Log(e.Host))
			if err := w.Kill(e.Host); err != nil && !errors.As(err, new(*exec.ExitError)) {
				return r, fmt.Errorf("kill tether-edge: %w", err)
			}
			r.kills++
			if time.Since(k.last()) < 5*time.Second {
				r.killsInTraffic++
			}
			w.StartEdge(s, e, w.ProxyArgs(e)...)
		case <-time.After(time.Second):
		}
	}
	stopSoak()
	wg.Wait()
	kwg.Wait()
	if cutNow {
		site.Heal()
	}
	r.soaked = time.Since(r.start)
	r.relayOK, r.relayTried = relay.ok.Load(), relay.tried.Load()
	r.kubeletOK, r.kubeletTried = k.ok.Load(), k.tried.Load()

	note("healed; waiting for tether-edge's queue to drain and the processes to settle")
	if err := waitDrained(ctx, e); err != nil {
		return r, err
	}
	if r.ledger, err = e.QueueLedger(ctx); err != nil {
		return r, err
	}
	if r.lost, r.lostDetail, err = k.lostWrites(ctx, w.CP.Client); err != nil {
		return r, err
	}
	// Settle: a few more relayed connections prove the path is back, and
	// idle connections time out, before the last sample.
	if err := w.WaitReachable(ctx, 60*time.Second); err != nil {
		return r, fmt.Errorf("after the soak: %w", err)
	}
	if r.gwEnd, err = settled(ctx, w.Client, world.GatewayAdmin(gw, "/metrics"), r.gwWarm); err != nil {
		return r, err
	}
	if r.edgeEnd, err = settled(ctx, e.Host, world.EdgeAdmin("/metrics"), r.edgeWarm); err != nil {
		return r, err
	}
	logs = append(logs, w.Log(e.Host), w.Log(gw))
	for _, l := range logs {
		r.panics += strings.Count(l, "panic:") + strings.Count(l, "fatal error:")
	}
	return r, nil
}

func tickerOrNil(d time.Duration) *time.Ticker {
	if d <= 0 {
		return nil
	}
	return time.NewTicker(d)
}

func tickC(t *time.Ticker) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// createPods creates the namespace, its default ServiceAccount and n pods
// bound to node, as the cloud's admin.
func createPods(ctx context.Context, admin kubernetes.Interface, node string, n int) ([]string, error) {
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if _, err := admin.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	var pods []string
	for i := range n {
		name := fmt.Sprintf("pod-%d", i)
		_, err := admin.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}},
				AutomountServiceAccountToken: new(bool)},
		}, metav1.CreateOptions{})
		if err != nil {
			return nil, err
		}
		pods = append(pods, name)
	}
	return pods, nil
}

// relay makes new-connection HTTPS GETs from the cloud client to the
// edge's stand-in kubelet, by the node's address, through the gateway.
type relay struct {
	client    *http.Client
	url       string
	ok, tried atomic.Int64
	lastErrMu sync.Mutex
	lastErr   error
}

func newRelay(w *world.World, e *world.Edge) *relay {
	return &relay{client: benchkit.NewConnClient(w.Client.DialContext, w.KubeletCA.Pool(), 5*time.Second), url: e.KubeletURL("/healthz")}
}

func (r *relay) once(ctx context.Context) error {
	r.tried.Add(1)
	b, err := benchkit.Get(ctx, r.client, r.url)
	if err == nil && !strings.HasPrefix(string(b), "ok ") {
		err = fmt.Errorf("GET %s: %q", r.url, b)
	}
	if err == nil {
		r.ok.Add(1)
		return nil
	}
	r.lastErrMu.Lock()
	r.lastErr = err
	r.lastErrMu.Unlock()
	return err
}

// kubelet makes the node's kubelet requests through tether-edge: reads
// of its pods, status patches with a step per pod, Lease renewals.
type kubelet struct {
	c         kubernetes.Interface
	node      string
	pods      []string
	ok, tried atomic.Int64

	mu      sync.Mutex
	acked   map[string]int // pod -> the last step answered 200
	sent    map[string]int // pod -> the last step sent
	lastReq time.Time      // when the last request was made
}

// last is when the kubelet made its last request.
func (k *kubelet) last() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lastReq
}

func (k *kubelet) once(ctx context.Context, i int) error {
	k.tried.Add(1)
	k.mu.Lock()
	k.lastReq = time.Now()
	k.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pod := k.pods[i%len(k.pods)]
	var err error
	switch i % 4 {
	case 0, 1:
		_, err = k.c.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	case 2:
		k.mu.Lock()
		k.sent[pod]++
		step := k.sent[pod]
		k.mu.Unlock()
		patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":"True","message":"%d"}]}}`, stepCondition, step)
		_, err = k.c.CoreV1().Pods(namespace).Patch(ctx, pod, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
		if err == nil {
			k.mu.Lock()
			k.acked[pod] = max(k.acked[pod], step)
			k.mu.Unlock()
		}
	case 3:
		_, err = k.c.CoreV1().Nodes().Get(ctx, k.node, metav1.GetOptions{})
	}
	if err == nil {
		k.ok.Add(1)
	}
	return err
}

// lostWrites compares every pod's step upstream with the last one the
// proxy acknowledged: a pod behind it lost a write.
func (k *kubelet) lostWrites(ctx context.Context, admin kubernetes.Interface) (int, []string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	lost, detail := 0, []string(nil)
	for _, pod := range k.pods {
		p, err := admin.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return 0, nil, err
		}
		up := 0
		for _, c := range p.Status.Conditions {
			if string(c.Type) == stepCondition {
				fmt.Sscan(c.Message, &up)
			}
		}
		if up < k.acked[pod] {
			lost++
			detail = append(detail, fmt.Sprintf("%s: step %d upstream, %d acknowledged", pod, up, k.acked[pod]))
		}
	}
	return lost, detail, nil
}

// warmUp makes 2,000 relayed connections and 500 kubelet requests on a
// healthy world; all must succeed.
func warmUp(ctx context.Context, r *relay, k *kubelet, conc int) error {
	var wg sync.WaitGroup
	errs := make(chan error, conc+1)
	for range conc {
		wg.Go(func() {
			for range 2000 / conc {
				if err := r.once(ctx); err != nil {
					errs <- fmt.Errorf("relayed connection: %w", err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 500 {
			if err := k.once(ctx, i); err != nil {
				errs <- fmt.Errorf("kubelet request: %w", err)
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	return <-errs
}

// waitDrained waits until tether-edge answers again, with the cloud
// healthy and its queue of status writes empty.
func waitDrained(ctx context.Context, e *world.Edge) error {
	deadline := time.Now().Add(3 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		m, err := world.Get(ctx, e.Host, world.EdgeAdmin("/metrics"))
		if err == nil && world.Metric(m, "tether_edge_apiserver_queue_length") == 0 && upstreamHealthy(m) {
			return nil
		}
		last = fmt.Sprint(err, " queue ", world.Metric(m, "tether_edge_apiserver_queue_length"))
		if err := benchkit.Sleep(ctx, time.Second); err != nil {
			return err
		}
	}
	return fmt.Errorf("tether-edge's queue did not drain in 3 minutes (%s)", last)
}

// upstreamHealthy reports whether the exposition has an upstream
// apiserver that passes tether-edge's health checks.
func upstreamHealthy(exposition string) bool {
	for _, l := range strings.Split(exposition, "\n") {
		if strings.HasPrefix(l, "tether_edge_apiserver_upstream_healthy{") && strings.HasSuffix(l, " 1") {
			return true
		}
	}
	return false
}
