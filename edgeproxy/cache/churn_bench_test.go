package cache

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/internal/localapi"
)

// churnDays is how long BenchmarkWeekChurn simulates (a week; less for a
// quick run: go test -bench WeekChurn -args -churn-days 1).
var churnDays = flag.Float64("churn-days", 7, "days of churn BenchmarkWeekChurn simulates")

var (
	nodesGVR      = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	leasesGVR     = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	servicesGVR   = schema.GroupVersionResource{Version: "v1", Resource: "services"}
	secretsGVR    = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	namespacesGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
)

// BenchmarkWeekChurn simulates a week of an edge node's cache, on a
// simulated clock (nothing sleeps), and reports the file's size at the
// end and at its peak:
//
//   - the kubelet caches its 100 pods, its Node, Services (100),
//     ConfigMaps (20), Secrets (10) and its Lease; kube-proxy the
//     EndpointSlices (150), Services and its Node; coredns the
//     EndpointSlices, Services and Namespaces (20);
//   - every 10 s the node's status and Lease are written, two
//     EndpointSlices change (one every 5 s) and a pod's status changes;
//     a pod is replaced (deleted, a new one created, as a rollout does)
//     every 72 s on average, so each of the 100 pods about every 2 hours;
//     an EndpointSlice is replaced every 10 minutes;
//   - the node is offline an hour a day, and 12 hours on the fourth day:
//     its node status writes (every 10 s) and pod status writes are
//     queued (without coalescing: the worst case), the Lease and statuses
//     answered locally; when the cloud is back the queue is replayed and
//     the components list everything again (their watches are too old).
//
// Variants: "before" is the store as it was (no tombstone expiry, no
// compaction); "ttl" expires tombstones; "compact" adds compaction (the
// default store); "bound-16MiB" also bounds it at 16 MiB, under the
// long offline period's peak.
func BenchmarkWeekChurn(b *testing.B) {
	for _, v := range []struct {
		name string
		o    Options
	}{
		{"before", Options{TombstoneTTL: -1, noCompact: true}},
		{"ttl", Options{noCompact: true}},
		{"compact", Options{}},
		{"bound-16MiB", Options{MaxSize: 16 << 20}},
	} {
		b.Run(v.name, func(b *testing.B) {
			var r churnResult
			for range b.N {
				r = simulateChurn(b, v.o, time.Duration(*churnDays*24)*time.Hour)
			}
			b.ReportMetric(float64(r.file)/(1<<20), "file-MiB")
			b.ReportMetric(float64(r.peak)/(1<<20), "peak-MiB")
			b.ReportMetric(float64(r.used)/(1<<20), "used-MiB")
			b.ReportMetric(float64(r.tombstones), "tombstones")
			b.ReportMetric(r.compactions, "compactions")
			b.ReportMetric(r.evictions, "evictions")
			b.ReportMetric(float64(r.writes), "writes")
		})
	}
}

type churnResult struct {
	file, peak, used       int64
	tombstones, writes     int
	compactions, evictions float64
}

// churn is the simulated node and cloud.
type churn struct {
	tb     testing.TB
	s      *Store
	clk    *testingclock.FakeClock
	rng    *rand.Rand
	rv     uint64
	writes int

	pods     map[string]uint64 // the node's pods in the cloud, name -> rv
	slices   map[string]uint64
	services map[string]uint64
	nodeRV   uint64
	gen      int // names of new pods and slices
	peak     int64
}

// pad is filler that makes objects their usual size.
var pad = strings.Repeat("abcdefghij", 1500)

func (c *churn) next() uint64 { c.rv++; return c.rv }

// object builds an object of about size bytes.
func (c *churn) object(kind, apiVersion, ns, name string, rv uint64, size int) *localapi.Object {
	raw := make([]byte, 0, size+300)
	raw = fmt.Appendf(raw, `{"kind":%q,"apiVersion":%q,"metadata":{"name":%q,"namespace":%q,"uid":"uid-%s","resourceVersion":"%d","labels":{"app":%q}},"spec":{"nodeName":"edge-1"},"status":{"phase":"Running","pad":"`,
		kind, apiVersion, name, ns, name, rv, name)
	raw = append(raw, pad[:size]...) // letters: nothing to quote
	raw = append(raw, `"}}`...)
	return &localapi.Object{Kind: kind, APIVersion: apiVersion, Namespace: ns, Name: name, UID: "uid-" + name, RV: rv,
		Labels: map[string]string{"app": name}, Raw: raw}
}

func (c *churn) pod(name string, rv uint64) *localapi.Object {
	return c.object("Pod", "v1", "apps", name, rv, 4000)
}
func (c *churn) node(rv uint64) *localapi.Object {
	return c.object("Node", "v1", "", "edge-1", rv, 12000)
}
func (c *churn) slice(name string, rv uint64) *localapi.Object {
	return c.object("EndpointSlice", "discovery.k8s.io/v1", "apps", name, rv, 1200)
}
func (c *churn) service(name string, rv uint64) *localapi.Object {
	return c.object("Service", "v1", "apps", name, rv, 1000)
}

func (c *churn) put(comp string, gvr schema.GroupVersionResource, o *localapi.Object) {
	must(c.tb, c.s.Put(comp, gvr, o))
	c.writes++
}

// list is a complete list of the model's objects.
func (c *churn) list(kind, apiVersion string, m map[string]uint64, mk func(string, uint64) *localapi.Object, scope Scope) List {
	l := List{Kind: kind, APIVersion: apiVersion, RV: c.next(), Complete: true, Scope: scope}
	for name, rv := range m {
		l.Items = append(l.Items, mk(name, rv))
	}
	return l
}

// relist is what the components do when their watches are too old: list
// everything again.
func (c *churn) relist() {
	onNode := Scope{Fields: fields.OneTermEqualSelector("spec.nodeName", "edge-1")}
	must(c.tb, c.s.ApplyList("kubelet", pods, c.list("Pod", "v1", c.pods, c.pod, onNode)))
	for _, comp := range []string{"kube-proxy", "coredns"} {
		must(c.tb, c.s.ApplyList(comp, epslices, c.list("EndpointSlice", "discovery.k8s.io/v1", c.slices, c.slice, Scope{})))
	}
	for _, comp := range []string{"kubelet", "kube-proxy", "coredns"} {
		must(c.tb, c.s.ApplyList(comp, servicesGVR, c.list("Service", "v1", c.services, c.service, Scope{})))
	}
	c.writes += 6
}

func (c *churn) randomName(m map[string]uint64) string {
	i := c.rng.IntN(len(m))
	for name := range m {
		if i == 0 {
			return name
		}
		i--
	}
	return ""
}

// start caches what the components list at their start.
func (c *churn) start() {
	for range 100 {
		c.gen++
		c.pods[fmt.Sprint("pod-", c.gen)] = c.next()
	}
	for i := range 150 {
		c.slices[fmt.Sprint("slice-", i)] = c.next()
	}
	for i := range 100 {
		c.services[fmt.Sprint("svc-", i)] = c.next()
	}
	c.relist()
	small := func(comp string, gvr schema.GroupVersionResource, kind string, n, size int) {
		l := List{Kind: kind, APIVersion: "v1", RV: c.next(), Complete: true}
		for i := range n {
			l.Items = append(l.Items, c.object(kind, "v1", "apps", fmt.Sprint(strings.ToLower(kind), i), c.next(), size))
		}
		must(c.tb, c.s.ApplyList(comp, gvr, l))
	}
	small("kubelet", configs, "ConfigMap", 20, 2000)
	small("kubelet", secretsGVR, "Secret", 10, 1000)
	small("coredns", namespacesGVR, "Namespace", 20, 300)
	c.nodeRV = c.next()
	c.put("kubelet", nodesGVR, c.node(c.nodeRV))
	c.put("kube-proxy", nodesGVR, c.node(c.nodeRV))
	c.put("kubelet", leasesGVR, c.object("Lease", "coordination.k8s.io/v1", "kube-node-lease", "edge-1", c.next(), 400))
}

// online is 10 s with the cloud reachable.
func (c *churn) online(step int) {
	c.nodeRV = c.next()
	c.put("kubelet", nodesGVR, c.node(c.nodeRV))
	c.put("kube-proxy", nodesGVR, c.node(c.nodeRV))
	c.put("kubelet", leasesGVR, c.object("Lease", "coordination.k8s.io/v1", "kube-node-lease", "edge-1", c.next(), 400))
	for range 2 {
		name := c.randomName(c.slices)
		c.slices[name] = c.next()
		for _, comp := range []string{"kube-proxy", "coredns"} {
			c.put(comp, epslices, c.slice(name, c.slices[name]))
		}
	}
	name := c.randomName(c.pods)
	c.pods[name] = c.next()
	c.put("kubelet", pods, c.pod(name, c.pods[name]))
	if c.rng.IntN(72) < 10 { // a pod replaced
		old := c.randomName(c.pods)
		delete(c.pods, old)
		must(c.tb, c.s.Delete("kubelet", pods, c.pod(old, c.next()), true))
		c.gen++
		name := fmt.Sprint("pod-", c.gen)
		c.pods[name] = c.next()
		c.put("kubelet", pods, c.pod(name, c.pods[name]))
		c.pods[name] = c.next()
		c.put("kubelet", pods, c.pod(name, c.pods[name])) // Pending, then Running
	}
	if step%60 == 0 { // a slice replaced
		old := c.randomName(c.slices)
		delete(c.slices, old)
		c.gen++
		name := fmt.Sprint("slice-", c.gen)
		c.slices[name] = c.next()
		for _, comp := range []string{"kube-proxy", "coredns"} {
			must(c.tb, c.s.Delete(comp, epslices, c.slice(old, c.next()), true))
			c.put(comp, epslices, c.slice(name, c.slices[name]))
		}
	}
}

// offline is 10 s with the cloud unreachable: the cloud changes without
// the node seeing it; the node's writes are queued.
func (c *churn) offline() {
	for range 2 {
		name := c.randomName(c.slices)
		c.slices[name] = c.next()
	}
	c.enqueue("PUT", "/api/v1/nodes/edge-1/status", "nodes", "edge-1", 1500)
	must(c.tb, c.s.PutLocal("kubelet", nodesGVR, c.node(c.nodeRV+1)))
	must(c.tb, c.s.PutLocal("kubelet", leasesGVR, c.object("Lease", "coordination.k8s.io/v1", "kube-node-lease", "edge-1", 1, 400)))
	if c.rng.IntN(72) < 10 { // a container restarted: the pod's status
		name := c.randomName(c.pods)
		c.enqueue("PATCH", "/api/v1/namespaces/apps/pods/"+name+"/status", "pods", name, 800)
		must(c.tb, c.s.PutLocal("kubelet", pods, c.pod(name, 1)))
	}
}

func (c *churn) enqueue(method, path, resource, name string, size int) {
	must(c.tb, c.s.Enqueue(&QueuedWrite{Component: "kubelet", UserAgent: "kubelet/v1.36.3", Method: method, Path: path,
		ContentType: "application/strategic-merge-patch+json", Body: []byte(pad[:size]), Version: "v1",
		Resource: resource, Name: name, QueuedAt: c.clk.Now()}))
	c.writes++
}

// reconnect replays the queue (each write applied: the cloud's answer
// is cached) and relists.
func (c *churn) reconnect() {
	for q, err := range c.s.QueuedWrites(0) {
		must(c.tb, err)
		must(c.tb, c.s.Dequeue(q.Seq, OutcomeApplied))
		if q.Resource == "nodes" {
			c.nodeRV = c.next()
			c.put("kubelet", nodesGVR, c.node(c.nodeRV))
		} else if _, ok := c.pods[q.Name]; ok {
			c.pods[q.Name] = c.next()
			c.put("kubelet", pods, c.pod(q.Name, c.pods[q.Name]))
		}
	}
	c.relist()
}

// offlineAt says whether the node is offline at t (from the start): an
// hour a day, at a time that moves, and 12 hours on the fourth day.
func offlineAt(t time.Duration) bool {
	day := int(t / (24 * time.Hour))
	in := t % (24 * time.Hour)
	start := 10*time.Hour + time.Duration(day*3%8)*time.Hour
	length := time.Hour
	if day == 3 {
		length = 12 * time.Hour
	}
	return in >= start && in < start+length
}

func simulateChurn(tb testing.TB, o Options, length time.Duration) churnResult {
	clk := testingclock.NewFakeClock(testEpoch)
	o.Clock = clk
	s, err := OpenWith(filepath.Join(tb.TempDir(), FileName), o)
	must(tb, err)
	defer s.Close()
	// Without fsync: the size of the file is the same, the run much
	// shorter.
	s.db.NoSync, s.db.NoGrowSync = true, true
	c := &churn{tb: tb, s: s, clk: clk, rng: rand.New(rand.NewPCG(1, 2)),
		pods: map[string]uint64{}, slices: map[string]uint64{}, services: map[string]uint64{}}
	c.start()
	const tick = 10 * time.Second
	wasOffline := false
	for step := 1; time.Duration(step)*tick <= length; step++ {
		clk.Step(tick)
		off := offlineAt(time.Duration(step) * tick)
		switch {
		case off:
			c.offline()
		case wasOffline:
			c.reconnect()
			fallthrough
		default:
			c.online(step)
		}
		wasOffline = off
		if step%6 == 0 { // a commit a simulated minute, and the upkeep after it
			settle(tb, s)
			if f, _ := s.Usage(); f > c.peak {
				c.peak = f
			}
		}
	}
	settle(tb, s)
	r := churnResult{peak: c.peak, writes: c.writes,
		compactions: counter(tb, s.upkeep.compactions.WithLabelValues("ok"))}
	r.file, r.used = s.Usage()
	for _, comp := range []string{"kubelet", "kube-proxy", "coredns"} {
		r.evictions += counter(tb, s.upkeep.evictions.WithLabelValues(comp))
	}
	r.tombstones = countTombstones(tb, s)
	return r
}

func countTombstones(tb testing.TB, s *Store) int {
	n := 0
	must(tb, s.db.View(func(tx *bolt.Tx) error {
		objs := tx.Bucket(bucketObjects)
		return objs.ForEachBucket(func(comp []byte) error {
			cb := objs.Bucket(comp)
			return cb.ForEachBucket(func(res []byte) error {
				return cb.Bucket(res).ForEach(func(_, v []byte) error {
					if len(v) > 0 && v[0] == flagTombstone {
						n++
					}
					return nil
				})
			})
		})
	}))
	return n
}
