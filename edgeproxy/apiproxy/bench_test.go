package apiproxy

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/testenv"
)

// BenchmarkAPIServerProxy measures, in one run, the real tether-edge
// binary on an edge host and a real kube-apiserver on a cloud host:
// GET of a pod and LIST of 1,000 pods (spec.nodeName selector) direct and
// through the proxy (p50/p99), lists served from the cache per second
// with the site cut off, and the proxy's RSS when idle. Run it with
//
//	go test -run '^$' -bench APIServerProxy -benchtime 1x ./edgeproxy/apiproxy/
//
// The phases run once whatever b.N is; the figures are reported as
// metrics and as a table.
func BenchmarkAPIServerProxy(b *testing.B) {
	testenv.RequireRoot(b)
	const (
		node   = "bench-node"
		nPods  = 1000
		nGets  = 1000
		nLists = 40
	)
	topo := testenv.NewTopology(b, testenv.TopologySpec{
		CloudHosts: []string{"apiserver"},
		Sites:      []testenv.SiteSpec{{Name: "site", Hosts: []string{"edge"}}},
	})
	cloud, site := topo.Cloud("apiserver"), topo.Site("site")
	edgeHost := site.Host("edge")
	cp := testenv.StartControlPlane(b, testenv.ControlPlaneOptions{BindAddress: cloud.Addr.String(), Runner: cloud})
	ctx := context.Background()
	admin := cp.Client

	bin := buildEdge(b)
	dir := b.TempDir()
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		b.Fatal(err)
	}
	certFile, keyFile, err := kp.WriteFiles(dir, "node")
	if err != nil {
		b.Fatal(err)
	}
	caFile, err := cp.CA.WriteFile(dir, "ca")
	if err != nil {
		b.Fatal(err)
	}
	// The node and its 1,000 pods.
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	createPods(ctx, b, admin, node, nPods)

	proxyAddr := "127.0.0.1:10261"
	cmd := edgeHost.Start(b, bin, "--server-addr", cp.URL, "--cert", certFile, "--key", keyFile, "--server-ca", caFile,
		"--data-dir", filepath.Join(dir, "data"), "--apiserver-listen", proxyAddr, "--admin-listen", "127.0.0.1:10267",
		"--log-level", "warn") // health checks as shipped: every 2 s
	ready := func() error {
		c := &http.Client{Transport: &http.Transport{DialContext: edgeHost.DialContext}, Timeout: time.Second}
		resp, err := c.Get("http://127.0.0.1:10267/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("readyz %s", resp.Status)
		}
		return nil
	}
	testenv.EventuallyNoError(b, "the edge proxy ready", ready)

	_, nodeCfg, _ := cp.NodeClient(b, node)
	nodeCfg.Dial = edgeHost.DialContext // direct: from the edge host, across the site router
	nodeCfg.UserAgent = kubeletUA
	nodeCfg.QPS, nodeCfg.Burst = -1, 0
	jsonCfg := rest.CopyConfig(nodeCfg)
	jsonCfg.ContentType = "application/json"
	proxyCfg := &rest.Config{Host: "http://" + proxyAddr, UserAgent: kubeletUA, Dial: edgeHost.DialContext, QPS: -1}
	clients := []struct {
		name string
		c    kubernetes.Interface
	}{
		{"direct (protobuf)", mustClient(b, nodeCfg)},
		{"direct (JSON)", mustClient(b, jsonCfg)},
		{"tether-edge", mustClient(b, proxyCfg)},
	}
	listOpts := metav1.ListOptions{FieldSelector: "spec.nodeName=" + node}
	get := func(c kubernetes.Interface) error {
		_, err := c.CoreV1().Pods("bench").Get(ctx, "pod-0500", metav1.GetOptions{})
		return err
	}
	list := func(c kubernetes.Interface) error {
		l, err := c.CoreV1().Pods("").List(ctx, listOpts)
		if err == nil && len(l.Items) != nPods {
			err = fmt.Errorf("listed %d pods", len(l.Items))
		}
		return err
	}
	// Warm up every path (connections, the proxy's cache).
	for _, cl := range clients {
		for range 5 {
			if err := get(cl.c); err != nil {
				b.Fatalf("%s: %v", cl.name, err)
			}
			if err := list(cl.c); err != nil {
				b.Fatalf("%s: %v", cl.name, err)
			}
		}
	}
	// The caching of the warm-up's lists is not a cost of the GETs.
	settle(b, cmd.Process.Pid)
	type row struct {
		what, path string
		p50, p99   time.Duration
	}
	var rows []row
	var cpuRows []string
	for _, op := range []struct {
		name string
		n    int
		f    func(kubernetes.Interface) error
	}{{"GET pod", nGets, get}, {"LIST 1000 pods", nLists, list}} {
		// Interleave the clients so that drift on a shared machine hits
		// them alike.
		lat := make([][]time.Duration, len(clients))
		cpu0 := cpuNS(b, cmd.Process.Pid)
		for range op.n {
			for i, cl := range clients {
				start := time.Now()
				if err := op.f(cl.c); err != nil {
					b.Fatalf("%s %s: %v", op.name, cl.name, err)
				}
				lat[i] = append(lat[i], time.Since(start))
			}
		}
		// Also the caching in the background, and the health checks.
		cpu := float64(cpuNS(b, cmd.Process.Pid)-cpu0) / 1000 / float64(op.n)
		cpuRows = append(cpuRows, fmt.Sprintf("tether-edge CPU per proxied %s: %.0f µs", op.name, cpu))
		b.ReportMetric(cpu, strings.ReplaceAll(strings.ToLower(op.name), " ", "_")+"_edge_cpu_us")
		for i, cl := range clients {
			p50, p99 := percentile(lat[i], 50), percentile(lat[i], 99)
			rows = append(rows, row{op.name, cl.name, p50, p99})
			key := strings.NewReplacer(" ", "_", "(", "", ")", "").Replace(strings.ToLower(op.name + "_" + cl.name))
			b.ReportMetric(float64(p50.Microseconds())/1000, key+"_p50_ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, key+"_p99_ms")
		}
	}

	adminGet := func(path string) string {
		resp, err := (&http.Client{Transport: &http.Transport{DialContext: edgeHost.DialContext}}).Get("http://127.0.0.1:10267" + path)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	// Idle RSS with the cache of a node that runs 1,000 pods: sampled
	// every 10 s for a minute from 10 s after the lists, since it moves
	// with the moment internal/memtrim gives the free heap back (when
	// quiet for 5 s, at most every 30 s). The median is the figure, the
	// last sample's split and runtime figures are shown.
	var idle []int
	var memOnline map[string]int
	for range 6 {
		time.Sleep(10 * time.Second)
		memOnline = memKB(b, cmd.Process.Pid)
		idle = append(idle, memOnline["VmRSS"])
	}
	mapsOnline := rssByMapping(b, cmd.Process.Pid)
	heapOnline := goHeap(adminGet("/metrics"))
	slices.Sort(idle)
	rssOnline := (idle[2] + idle[3]) / 2
	b.ReportMetric(float64(rssOnline)/1024, "rss_idle_online_MB")
	b.ReportMetric(float64(memOnline["RssAnon"])/1024, "rss_anon_idle_online_MB")

	// Offline: lists served from the cache.
	site.Cut()
	testenv.EventuallyNoError(b, "the proxy offline", func() error {
		resp, err := (&http.Client{Transport: &http.Transport{DialContext: edgeHost.DialContext}}).Get("http://127.0.0.1:10267/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var sb strings.Builder
		buf := make([]byte, 64<<10)
		for {
			n, err := resp.Body.Read(buf)
			sb.Write(buf[:n])
			if err != nil {
				break
			}
		}
		if !strings.Contains(sb.String(), "tether_edge_apiserver_upstream_healthy{server=\""+strings.TrimPrefix(cp.URL, "https://")+"\"} 0") {
			return fmt.Errorf("still healthy")
		}
		return nil
	})
	proxy := clients[2].c
	var offlineLat []time.Duration
	for range nLists {
		start := time.Now()
		if err := list(proxy); err != nil {
			b.Fatalf("offline list: %v", err)
		}
		offlineLat = append(offlineLat, time.Since(start))
	}
	rows = append(rows, row{"LIST 1000 pods", "tether-edge offline (cache, JSON)", percentile(offlineLat, 50), percentile(offlineLat, 99)})
	// Throughput: clients that read the bytes without decoding them, so
	// that the figure is the proxy's, not the clients' JSON decoding.
	var served atomic.Int64
	runFor := 5 * time.Second
	deadline := time.Now().Add(runFor)
	var wg sync.WaitGroup
	listURL := "http://" + proxyAddr + "/api/v1/pods?fieldSelector=spec.nodeName%3D" + node
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Transport: &http.Transport{DialContext: edgeHost.DialContext}}
			for time.Now().Before(deadline) {
				req, _ := http.NewRequest("GET", listURL, nil)
				req.Header.Set("User-Agent", kubeletUA)
				resp, err := c.Do(req)
				if err != nil {
					b.Errorf("offline list: %v", err)
					return
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || n < nPods*100 {
					b.Errorf("offline list: %s, %d bytes", resp.Status, n)
					return
				}
				served.Add(1)
			}
		}()
	}
	wg.Wait()
	perSec := float64(served.Load()) / runFor.Seconds()
	b.ReportMetric(perSec, "offline_lists_per_s")
	time.Sleep(15 * time.Second)
	rssBurst := rssKB(b, cmd.Process.Pid)
	b.ReportMetric(float64(rssBurst)/1024, "rss_after_offline_burst_MB")
	time.Sleep(2 * time.Minute) // the Go runtime collects an idle heap every 2 minutes
	heapOffline := goHeap(adminGet("/metrics"))
	memOffline := memKB(b, cmd.Process.Pid)
	mapsOffline := rssByMapping(b, cmd.Process.Pid)
	rssOffline := memOffline["VmRSS"]
	b.ReportMetric(float64(rssOffline)/1024, "rss_idle_offline_MB")
	b.ReportMetric(float64(memOffline["RssAnon"])/1024, "rss_anon_idle_offline_MB")
	site.Heal()
	fi, _ := os.Stat(filepath.Join(dir, "data", "apiserver-cache.db"))

	var t strings.Builder
	fmt.Fprintf(&t, "\n%-16s %-30s %10s %10s\n", "operation", "path", "p50", "p99")
	for _, r := range rows {
		fmt.Fprintf(&t, "%-16s %-30s %10s %10s\n", r.what, r.path, r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond))
	}
	direct := func(op string) time.Duration {
		return rows[slices.IndexFunc(rows, func(r row) bool { return r.what == op })].p50
	}
	proxied := func(op string) time.Duration {
		return rows[slices.IndexFunc(rows, func(r row) bool { return r.what == op && r.path == "tether-edge" })].p50
	}
	for _, op := range []string{"GET pod", "LIST 1000 pods"} {
		fmt.Fprintf(&t, "added p50 latency, %s, vs direct protobuf: %+.1f%%\n", op, 100*(float64(proxied(op))/float64(direct(op))-1))
	}
	for _, r := range cpuRows {
		fmt.Fprintln(&t, r)
	}
	fmt.Fprintf(&t, "offline LISTs of 1000 pods served from the cache: %.0f/s (4 clients reading the bytes, %v)\n", perSec, runFor)
	fmt.Fprintf(&t, "tether-edge RSS idle: %.1f MB online (median of a minute, %.1f–%.1f); offline %.1f MB 15 s after the burst of lists, %.1f MB 2 min later (cache of %d pods, file %.1f MB)\n",
		float64(rssOnline)/1024, float64(idle[0])/1024, float64(idle[5])/1024, float64(rssBurst)/1024, float64(rssOffline)/1024, nPods, float64(fi.Size())/(1<<20))
	fmt.Fprintf(&t, "  of which: online %s; offline %s\n", memSplit(memOnline), memSplit(memOffline))
	fmt.Fprintf(&t, "  by mapping: online %s; offline %s\n", mapsOnline, mapsOffline)
	fmt.Fprintf(&t, "  Go runtime: online %s; offline %s\n", heapOnline, heapOffline)
	b.Log(t.String())
	fmt.Print(t.String())
}

func buildEdge(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "tether-edge")
	// As the packages build it (Makefile): static, no symbol table.
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "github.com/tether-edge/tether/cmd/tether-edge")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("build tether-edge: %v\n%s", err, out)
	}
	return bin
}

func createPods(ctx context.Context, b *testing.B, admin kubernetes.Interface, node string, n int) {
	b.Helper()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts("bench").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				_, err := admin.CoreV1().Pods("bench").Create(ctx, &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%04d", i),
						Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%20), "tier": "bench"}},
					Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: ptr.To(false),
						Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1",
							Env: []corev1.EnvVar{{Name: "INDEX", Value: strconv.Itoa(i)}}}}},
				}, metav1.CreateOptions{})
				if err != nil {
					b.Error(err)
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}

func mustClient(b *testing.B, cfg *rest.Config) kubernetes.Interface {
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))]
}

// rssKB reads a process's resident set size.
func rssKB(b *testing.B, pid int) int {
	b.Helper()
	return memKB(b, pid)["VmRSS"]
}

// memKB reads the memory lines of /proc/<pid>/status (VmRSS, RssAnon,
// RssFile, ...), in kB.
func memKB(b *testing.B, pid int) map[string]int {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	m := map[string]int{}
	for line := range strings.SplitSeq(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if v, isKB := strings.CutSuffix(strings.TrimSpace(v), " kB"); ok && isKB {
			m[k], _ = strconv.Atoi(v)
		}
	}
	if _, ok := m["VmRSS"]; !ok {
		b.Fatal("no VmRSS")
	}
	return m
}

// rssByMapping says which mappings a process's RSS lies in
// (/proc/<pid>/smaps): the binary, the cache file, anonymous memory.
func rssByMapping(b *testing.B, pid int) string {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		b.Fatal(err)
	}
	kb := map[string]int{}
	var name string
	for line := range strings.SplitSeq(string(data), "\n") {
		fs := strings.Fields(line)
		switch {
		case len(fs) >= 5 && strings.Contains(fs[0], "-") && !strings.HasSuffix(fs[0], ":"):
			name = "anon"
			if len(fs) >= 6 {
				name = filepath.Base(fs[5])
			}
		case len(fs) == 3 && fs[0] == "Rss:":
			n, _ := strconv.Atoi(fs[1])
			kb[name] += n
		}
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(kb)) {
		if kb[k] >= 100 {
			parts = append(parts, fmt.Sprintf("%s %.1f", k, float64(kb[k])/1024))
		}
	}
	return strings.Join(parts, ", ") + " MB"
}

// goHeap summarizes the Go runtime's memory from a /metrics page: live
// heap, heap spans in use, free heap not yet returned to the OS, stacks.
func goHeap(metrics string) string {
	v := func(name string) float64 {
		for line := range strings.SplitSeq(metrics, "\n") {
			if rest, ok := strings.CutPrefix(line, name+" "); ok {
				f, _ := strconv.ParseFloat(rest, 64)
				return f / (1 << 20)
			}
		}
		return -1
	}
	return fmt.Sprintf("heap alloc %.1f MB, in use %.1f, idle not released %.1f, stacks %.1f, sys %.1f",
		v("go_memstats_heap_alloc_bytes"), v("go_memstats_heap_inuse_bytes"),
		v("go_memstats_heap_idle_bytes")-v("go_memstats_heap_released_bytes"), v("go_memstats_stack_inuse_bytes"), v("go_memstats_sys_bytes"))
}

// memSplit says what an RSS is made of: the process's own memory
// (anonymous: heap, stacks) and file pages (the mapped binary, bbolt's
// mmap of the cache), which the kernel shares and reclaims.
func memSplit(m map[string]int) string {
	return fmt.Sprintf("%.1f MB anon + %.1f MB file", float64(m["RssAnon"])/1024, float64(m["RssFile"]+m["RssShmem"])/1024)
}

// cpuNS is the CPU time a process's threads have had, in nanoseconds
// (the first field of each /proc/<pid>/task/<tid>/schedstat).
func cpuNS(b *testing.B, pid int) int64 {
	b.Helper()
	files, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(files) == 0 {
		b.Fatalf("schedstat of %d: %v", pid, err)
	}
	var sum int64
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		if fs := strings.Fields(string(data)); len(fs) > 0 {
			n, _ := strconv.ParseInt(fs[0], 10, 64)
			sum += n
		}
	}
	return sum
}

// settle waits, at most 30 s, until a process used less than 4 ms of CPU
// in 200 ms: the proxy caches what it relayed in the background.
func settle(b *testing.B, pid int) {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	last := cpuNS(b, pid)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		now := cpuNS(b, pid)
		if now-last < int64(4*time.Millisecond) {
			return
		}
		last = now
	}
	b.Logf("tether-edge still busy after 30 s")
}
