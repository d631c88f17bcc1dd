package election

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	testclock "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/gateway/internal/pooltest"
	"github.com/tether-edge/tether/gateway/poolcheck"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// cluster is a real apiserver with the gateway's RBAC applied, nodes in
// pools, and a Handler acting with the gateway's identity on a fake
// clock; its log is kept.
type cluster struct {
	t     *testing.T
	ctx   context.Context
	admin kubernetes.Interface
	h     *Handler
	clock *testclock.FakePassiveClock
	log   *testenv.LogBuffer
}

// t0 is the gateway's clock, a whole second in the past: the edges' own
// clocks (time.Now) run ahead of it.
var t0 = time.Now().Add(-time.Hour).Truncate(time.Second)

func newCluster(t *testing.T) *cluster {
	t.Helper()
	pc := pooltest.Start(t, pooltest.Options{Pools: map[string]string{"edge-1": "shop", "edge-2": "shop", "yard-1": "yard", "loner": ""}})
	ctx, gw := pc.Ctx, pc.Gateway
	c := &cluster{t: t, ctx: ctx, admin: pc.Client, clock: testclock.NewFakePassiveClock(t0), log: &testenv.LogBuffer{}}
	var err error
	c.h, err = New(Options{Client: gw, Nodes: poolcheck.APINodes{Client: gw}, Clock: c.clock,
		Logger: slog.New(slog.NewTextHandler(c.log, nil)), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// electionRecord is an election record ConfigMap for pool as the edge's elector
// sends it.
func electionRecord(pool, rv string, rec record.Election) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.ElectionName(pool), Namespace: record.Namespace, ResourceVersion: rv}}
	if err := record.SetElection(cm, rec); err != nil {
		panic(err)
	}
	return cm
}

// syncRecord is a sync record ConfigMap for pool as the edge sends it.
func syncRecord(pool, rv string, rec record.Sync) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.SyncName(pool), Namespace: record.Namespace,
		ResourceVersion: rv}, Data: rec.Data()}
}

// held is a record of holder, renewed at renew, of 15 s.
func held(holder string, renew time.Time) record.Election {
	return record.Election{HolderIdentity: holder, LeaseDurationSeconds: 15,
		AcquireTime: metav1.NewTime(renew), RenewTime: metav1.NewTime(renew)}
}

// send asks the handler, as sender, to write cm.
func (c *cluster) send(sender string, op tunnel.ElectionOp, kind tunnel.RecordKind, pool string, cm *corev1.ConfigMap) tunnel.ElectionReply {
	c.t.Helper()
	b, err := json.Marshal(cm)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.h.Elect(c.ctx, sender, tunnel.ElectionRequest{Op: op, Record: kind, Pool: pool, ConfigMap: b})
}

// stored decodes the ConfigMap of an OK reply.
func (c *cluster) stored(rep tunnel.ElectionReply) *corev1.ConfigMap {
	c.t.Helper()
	if rep.Code != tunnel.OK {
		c.t.Fatalf("reply %+v, want OK", rep)
	}
	var cm corev1.ConfigMap
	if err := json.Unmarshal(rep.ConfigMap, &cm); err != nil {
		c.t.Fatal(err)
	}
	return &cm
}

// get reads the ConfigMap name of tether-system as the cluster holds it
// (nil if there is none).
func (c *cluster) get(name string) *corev1.ConfigMap {
	c.t.Helper()
	cm, err := c.admin.CoreV1().ConfigMaps(record.Namespace).Get(c.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		c.t.Fatal(err)
	}
	return cm
}

func (c *cluster) electionRecord(pool string) record.Election {
	c.t.Helper()
	cm := c.get(record.ElectionName(pool))
	if cm == nil {
		c.t.Fatalf("no election record for %s", pool)
	}
	rec, err := record.DecodeElection(cm)
	if err != nil {
		c.t.Fatal(err)
	}
	return rec
}

func (c *cluster) count(code tunnel.Code) float64 {
	c.t.Helper()
	v, err := metrictest.Value(c.h.results, "tether_gateway_election_writes_total", "result="+code.String())
	if err != nil {
		c.t.Fatal(err)
	}
	return v
}

// TestElect: an edge takes its pool's free record, renews it, keeps what
// the cluster put on it, releases it, and another member takes it; the
// leader writes its sync record. Every reply carries the record as
// stored, on whose version the next write is made. Times later than the
// gateway's clock are clamped to it.
func TestElect(t *testing.T) {
	c := newCluster(t)
	edgeNow := time.Now().Truncate(time.Second) // an hour ahead of the gateway

	// edge-1 takes shop's record, with labels and annotations of its own
	// that are not written.
	sent := electionRecord("shop", "", held("edge-1", edgeNow))
	sent.Labels = map[string]string{"from": "edge"}
	sent.Annotations["other"] = "from the edge"
	sent.Data = map[string]string{"k": "from the edge"}
	sent.UID = "uid-from-the-edge"
	got := c.stored(c.send("edge-1", tunnel.ElectionCreate, tunnel.RecordElection, "shop", sent))
	cm := c.get("pool-shop")
	if got.ResourceVersion != cm.ResourceVersion || got.UID != cm.UID || got.Name != "pool-shop" || got.Namespace != "tether-system" {
		t.Fatalf("reply %+v; stored %+v", got.ObjectMeta, cm.ObjectMeta)
	}
	if len(cm.Labels) != 0 || len(cm.Data) != 0 || len(cm.Annotations) != 1 || cm.UID == "uid-from-the-edge" {
		t.Fatalf("stored beyond the record: %+v, data %v", cm.ObjectMeta, cm.Data)
	}
	want := held("edge-1", t0) // clamped to the gateway's clock
	if diff := cmp.Diff(want, c.electionRecord("shop")); diff != "" {
		t.Fatalf("record (-want +got):\n%s", diff)
	}
	if got.Annotations[record.ElectionAnnotation] != cm.Annotations[record.ElectionAnnotation] {
		t.Fatalf("reply's record %q, stored %q", got.Annotations[record.ElectionAnnotation], cm.Annotations[record.ElectionAnnotation])
	}

	// An operator labels and annotates it: kept by the next renewal, on
	// the version the edge last got back; data the edge sends is not.
	cm.Labels = map[string]string{"team": "ops"}
	cm.Annotations["note"] = "kept"
	cm, err := c.admin.CoreV1().ConfigMaps(record.Namespace).Update(c.ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.clock.SetTime(c.clock.Now().Add(2 * time.Second))
	renew := electionRecord("shop", cm.ResourceVersion, record.Election{HolderIdentity: "edge-1", LeaseDurationSeconds: 15,
		AcquireTime: metav1.NewTime(t0), RenewTime: metav1.NewTime(t0.Add(2 * time.Second))})
	renew.Labels = map[string]string{"team": "edge"}
	renew.Data = map[string]string{"k": "from the edge"}
	got = c.stored(c.send("edge-1", tunnel.ElectionUpdate, tunnel.RecordElection, "shop", renew))
	cm = c.get("pool-shop")
	if got.ResourceVersion != cm.ResourceVersion || cm.Labels["team"] != "ops" || cm.Annotations["note"] != "kept" || len(cm.Data) != 0 {
		t.Fatalf("after the renewal: reply version %s, stored %+v, data %v", got.ResourceVersion, cm.ObjectMeta, cm.Data)
	}
	if r := c.electionRecord("shop"); !r.RenewTime.Time.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("renewTime %v, want %v", r.RenewTime, t0.Add(2*time.Second))
	}

	// The leader's sync record: created, clamped, then updated.
	got = c.stored(c.send("edge-1", tunnel.ElectionCreate, tunnel.RecordSync, "shop",
		syncRecord("shop", "", record.Sync{HolderIdentity: "edge-1", RenewTime: edgeNow, LeaseDurationSeconds: 30})))
	sync := c.get("pool-shop-sync")
	sr, err := record.DecodeSync(sync)
	if err != nil || sr.HolderIdentity != "edge-1" || !sr.RenewTime.Equal(c.clock.Now()) || sr.LeaseDurationSeconds != 30 {
		t.Fatalf("sync record %+v, %v; want edge-1's, renewed at the gateway's clock %v", sr, err, c.clock.Now())
	}
	if got.ResourceVersion != sync.ResourceVersion || got.Data["holderIdentity"] != "edge-1" || len(sync.Annotations) != 0 {
		t.Fatalf("reply %+v %v; stored %+v", got.ObjectMeta, got.Data, sync.ObjectMeta)
	}
	c.clock.SetTime(c.clock.Now().Add(time.Second))
	synced := c.clock.Now().Add(-time.Second)
	got = c.stored(c.send("edge-1", tunnel.ElectionUpdate, tunnel.RecordSync, "shop",
		syncRecord("shop", got.ResourceVersion, record.Sync{HolderIdentity: "edge-1", RenewTime: synced, LeaseDurationSeconds: 30})))
	sync = c.get("pool-shop-sync")
	if sr, _ := record.DecodeSync(sync); !sr.RenewTime.Equal(synced) || got.ResourceVersion != sync.ResourceVersion {
		t.Fatalf("sync record renewed at %v (version %s, reply %s), want %v (not clamped: in the past)", sr.RenewTime,
			sync.ResourceVersion, got.ResourceVersion, synced)
	}

	// edge-1 releases; edge-2 takes the released record.
	cm = c.get("pool-shop")
	got = c.stored(c.send("edge-1", tunnel.ElectionUpdate, tunnel.RecordElection, "shop", electionRecord("shop", cm.ResourceVersion,
		record.Election{LeaseDurationSeconds: 1, AcquireTime: metav1.NewTime(t0), RenewTime: metav1.NewTime(t0)})))
	if r := c.electionRecord("shop"); r.HolderIdentity != "" {
		t.Fatalf("after the release: holder %q", r.HolderIdentity)
	}
	took := held("edge-2", t0)
	took.LeaderTransitions = 1
	c.stored(c.send("edge-2", tunnel.ElectionUpdate, tunnel.RecordElection, "shop", electionRecord("shop", got.ResourceVersion, took)))
	if diff := cmp.Diff(took, c.electionRecord("shop")); diff != "" {
		t.Fatalf("edge-2's record (-want +got):\n%s", diff)
	}
	if n := c.count(tunnel.OK); n != 6 {
		t.Errorf("ok count %v, want 6", n)
	}
}

// TestConflict: a write based on an older version, a create of a record
// that exists, and an update of one that is gone are conflicts, and write
// nothing.
func TestConflict(t *testing.T) {
	c := newCluster(t)
	first := c.stored(c.send("edge-1", tunnel.ElectionCreate, tunnel.RecordElection, "shop", electionRecord("shop", "", held("edge-1", t0))))
	c.clock.SetTime(t0.Add(time.Second))
	renewed := c.stored(c.send("edge-1", tunnel.ElectionUpdate, tunnel.RecordElection, "shop",
		electionRecord("shop", first.ResourceVersion, held("edge-1", t0.Add(time.Second)))))
	rv := c.get("pool-shop").ResourceVersion
	if rv != renewed.ResourceVersion || rv == first.ResourceVersion {
		t.Fatalf("versions: created %s, renewed %s, stored %s", first.ResourceVersion, renewed.ResourceVersion, rv)
	}

	for name, tc := range map[string]struct {
		op tunnel.ElectionOp
		cm *corev1.ConfigMap
	}{
		"stale version": {tunnel.ElectionUpdate, electionRecord("shop", first.ResourceVersion, held("edge-2", t0))},
		"create again":  {tunnel.ElectionCreate, electionRecord("shop", "", held("edge-2", t0))},
	} {
		rep := c.send("edge-2", tc.op, tunnel.RecordElection, "shop", tc.cm)
		if rep.Code != tunnel.Conflict || rep.ConfigMap != nil {
			t.Errorf("%s: reply %+v, want a conflict", name, rep)
		}
	}
	if cm := c.get("pool-shop"); cm.ResourceVersion != rv {
		t.Fatalf("record written by a conflicting write: %+v", cm)
	}
	if err := c.admin.CoreV1().ConfigMaps(record.Namespace).Delete(c.ctx, "pool-shop", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if rep := c.send("edge-1", tunnel.ElectionUpdate, tunnel.RecordElection, "shop", electionRecord("shop", rv, held("edge-1", t0))); rep.Code != tunnel.Conflict {
		t.Fatalf("update of a deleted record: %+v, want a conflict", rep)
	}
	if cm := c.get("pool-shop"); cm != nil {
		t.Fatalf("deleted record written again: %+v", cm)
	}
	if n := c.count(tunnel.Conflict); n != 3 {
		t.Errorf("conflict count %v, want 3", n)
	}
}

// TestRefusals: whatever is refused writes nothing, is counted by its
// reason and logged with the node, the pool and the reason.
func TestRefusals(t *testing.T) {
	c := newCluster(t)
	// shop is led by edge-1; yard's record names yard-1 but has expired.
	shop := c.stored(c.send("edge-1", tunnel.ElectionCreate, tunnel.RecordElection, "shop", electionRecord("shop", "", held("edge-1", t0))))
	c.stored(c.send("yard-1", tunnel.ElectionCreate, tunnel.RecordElection, "yard", electionRecord("yard", "", held("yard-1", t0.Add(-time.Minute)))))
	before := map[string]string{}
	for _, name := range []string{"pool-shop", "pool-yard"} {
		before[name] = c.get(name).ResourceVersion
	}
	shopRV := shop.ResourceVersion
	mine := func(pool string) *corev1.ConfigMap { return electionRecord(pool, "", held("edge-1", t0)) }
	raw := func(s string) []byte { return []byte(s) }
	for _, tc := range []struct {
		name   string
		sender string
		op     tunnel.ElectionOp
		kind   tunnel.RecordKind
		pool   string
		cm     *corev1.ConfigMap // or body
		body   []byte
		want   tunnel.Code
	}{
		{"sender unknown", "ghost", tunnel.ElectionCreate, tunnel.RecordElection, "shop", electionRecord("shop", "", held("ghost", t0)), nil, tunnel.UnknownNode},
		{"sender in no pool", "loner", tunnel.ElectionCreate, tunnel.RecordElection, "shop", electionRecord("shop", "", held("loner", t0)), nil, tunnel.NotInPool},
		{"another pool's record", "edge-1", tunnel.ElectionUpdate, tunnel.RecordElection, "yard", electionRecord("yard", before["pool-yard"], held("edge-1", t0)), nil, tunnel.OtherPool},
		{"a new pool's record", "edge-1", tunnel.ElectionCreate, tunnel.RecordElection, "lab", mine("lab"), nil, tunnel.OtherPool},
		{"another pool's sync record", "edge-1", tunnel.ElectionCreate, tunnel.RecordSync, "yard",
			syncRecord("yard", "", record.Sync{HolderIdentity: "edge-1", RenewTime: t0, LeaseDurationSeconds: 30}), nil, tunnel.OtherPool},
		{"the sync record's name as the election record", "edge-1", tunnel.ElectionCreate, tunnel.RecordElection, "shop",
			electionRecord("shop-sync", "", held("edge-1", t0)), nil, tunnel.BadRecord},
		{"the election record's name as the sync record", "edge-1", tunnel.ElectionUpdate, tunnel.RecordSync, "shop",
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pool-shop", ResourceVersion: shopRV},
				Data: record.Sync{HolderIdentity: "edge-1", RenewTime: t0, LeaseDurationSeconds: 30}.Data()}, nil, tunnel.BadRecord},
		{"another ConfigMap", "edge-1", tunnel.ElectionCreate, tunnel.RecordElection, "shop",
			func() *corev1.ConfigMap { cm := mine("shop"); cm.Name = "coredns"; return cm }(), nil, tunnel.BadRecord},
		{"another namespace", "edge-1", tunnel.ElectionCreate, tunnel.RecordElection, "shop",
			func() *corev1.ConfigMap { cm := mine("shop"); cm.Namespace = "kube-system"; return cm }(), nil, tunnel.BadRecord},
		{"not JSON", "edge-1", tunnel.ElectionCreate, tunnel.RecordElection, "shop", nil, raw("elect me"), tunnel.BadRecord},
		{"a Secret", "edge-1", tunnel.ElectionCreate, tunnel.RecordElection, "shop", nil,
			raw(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"pool-shop"}}`), tunnel.BadRecord},
		{"no record annotation", "edge-1", tunnel.ElectionUpdate, tunnel.RecordElection, "shop",
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pool-shop", ResourceVersion: shopRV}}, nil, tunnel.BadRecord},
		{"record not JSON", "edge-1", tunnel.ElectionUpdate, tunnel.RecordElection, "shop",
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pool-shop", ResourceVersion: shopRV,
				Annotations: map[string]string{record.ElectionAnnotation: "edge-1"}}}, nil, tunnel.BadRecord},
		{"update without a version", "edge-1", tunnel.ElectionUpdate, tunnel.RecordElection, "shop", mine("shop"), nil, tunnel.BadRecord},
		{"sync record without renewTime", "edge-1", tunnel.ElectionCreate, tunnel.RecordSync, "shop",
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pool-shop-sync"},
				Data: map[string]string{"holderIdentity": "edge-1", "leaseDurationSeconds": "30"}}, nil, tunnel.BadRecord},
		{"names another holder", "edge-2", tunnel.ElectionUpdate, tunnel.RecordElection, "shop", electionRecord("shop", shopRV, held("edge-1", t0)), nil, tunnel.NotHolder},
		{"creates a released record", "edge-2", tunnel.ElectionCreate, tunnel.RecordElection, "shop", electionRecord("shop", "", held("", t0)), nil, tunnel.NotHolder},
		{"releases another's record", "edge-2", tunnel.ElectionUpdate, tunnel.RecordElection, "shop", electionRecord("shop", shopRV, held("", t0)), nil, tunnel.NotLeader},
		{"sync record naming another", "edge-2", tunnel.ElectionCreate, tunnel.RecordSync, "shop",
			syncRecord("shop", "", record.Sync{HolderIdentity: "edge-1", RenewTime: t0, LeaseDurationSeconds: 30}), nil, tunnel.NotHolder},
		{"sync record of a follower", "edge-2", tunnel.ElectionCreate, tunnel.RecordSync, "shop",
			syncRecord("shop", "", record.Sync{HolderIdentity: "edge-2", RenewTime: t0, LeaseDurationSeconds: 30}), nil, tunnel.NotLeader},
		{"sync record of an expired leader", "yard-1", tunnel.ElectionCreate, tunnel.RecordSync, "yard",
			syncRecord("yard", "", record.Sync{HolderIdentity: "yard-1", RenewTime: t0, LeaseDurationSeconds: 30}), nil, tunnel.LeaderExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := tc.body
			if tc.cm != nil {
				var err error
				if body, err = json.Marshal(tc.cm); err != nil {
					t.Fatal(err)
				}
			}
			n := c.count(tc.want)
			logged := len(c.log.String())
			rep := c.h.Elect(c.ctx, tc.sender, tunnel.ElectionRequest{Op: tc.op, Record: tc.kind, Pool: tc.pool, ConfigMap: body})
			if rep.Code != tc.want || rep.Message == "" || rep.ConfigMap != nil {
				t.Fatalf("reply %+v, want %v with a message", rep, tc.want)
			}
			if got := c.count(tc.want); got != n+1 {
				t.Errorf("%v count %v, want %v", tc.want, got, n+1)
			}
			for name, rv := range before {
				if cm := c.get(name); cm.ResourceVersion != rv {
					t.Errorf("%s written: %+v", name, cm.ObjectMeta)
				}
			}
			for _, name := range []string{"pool-lab", "pool-shop-sync", "pool-yard-sync", "coredns", "pool-shop-sync-sync"} {
				if cm := c.get(name); cm != nil {
					t.Errorf("%s created", name)
				}
			}
			line, log := "", c.log.String()[logged:]
			for _, l := range strings.Split(log, "\n") {
				if strings.Contains(l, "reason="+tc.want.String()) && strings.Contains(l, "node="+tc.sender) && strings.Contains(l, "pool="+tc.pool) {
					line = l
				}
			}
			if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "election record write refused") {
				t.Errorf("no warning with node=%s pool=%s reason=%s in the log:\n%s", tc.sender, tc.pool, tc.want, log)
			}
		})
	}
}

// An apiserver error, or a node view not ready, is Unavailable (another
// replica may do better), and nothing is written.
func TestUnavailable(t *testing.T) {
	c := newCluster(t)
	h, err := New(Options{Client: c.admin, Nodes: failingNodes{}, Clock: c.clock})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(electionRecord("shop", "", held("edge-1", t0)))
	rep := h.Elect(c.ctx, "edge-1", tunnel.ElectionRequest{Op: tunnel.ElectionCreate, Record: tunnel.RecordElection, Pool: "shop", ConfigMap: b})
	if rep.Code != tunnel.Unavailable {
		t.Fatalf("reply %+v, want unavailable", rep)
	}
	if cm := c.get("pool-shop"); cm != nil {
		t.Fatalf("record written: %+v", cm)
	}
}

type failingNodes struct{}

func (failingNodes) NodePool(context.Context, string) (string, bool, error) {
	return "", false, errors.New("node informer not synced yet")
}

// TestLeaseDurationClampedOnWrite: a holder that sends a lease far longer
// than the pool's gets it stored at most the pools' configured lease, its
// sync record at most record.SyncLeaseSeconds; once it stops renewing, its
// sync record is refused after the pool's lease, not after its own.
func TestLeaseDurationClampedOnWrite(t *testing.T) {
	c := newCluster(t)
	huge := record.Election{HolderIdentity: "edge-1", LeaseDurationSeconds: 3000000000,
		AcquireTime: metav1.NewTime(t0), RenewTime: metav1.NewTime(t0)}
	c.stored(c.send("edge-1", tunnel.ElectionCreate, tunnel.RecordElection, "shop", electionRecord("shop", "", huge)))
	if got := c.electionRecord("shop").LeaseDurationSeconds; got != 15 {
		t.Errorf("leaseDurationSeconds stored %d, want 15 (the pools' lease)", got)
	}
	c.stored(c.send("edge-1", tunnel.ElectionCreate, tunnel.RecordSync, "shop",
		syncRecord("shop", "", record.Sync{HolderIdentity: "edge-1", RenewTime: t0, LeaseDurationSeconds: 3000000000})))
	sr, err := record.DecodeSync(c.get("pool-shop-sync"))
	if err != nil || sr.LeaseDurationSeconds != record.SyncLeaseSeconds {
		t.Errorf("sync record %+v, %v; want leaseDurationSeconds %d", sr, err, record.SyncLeaseSeconds)
	}

	// The record as sent, written past the gateway (as with an older
	// one): its holder stopped renewing 16 s ago.
	cm := c.get("pool-shop")
	if err := record.SetElection(cm, huge); err != nil {
		t.Fatal(err)
	}
	if _, err := c.admin.CoreV1().ConfigMaps(record.Namespace).Update(c.ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.clock.SetTime(t0.Add(16 * time.Second))
	sync := c.get("pool-shop-sync")
	rep := c.send("edge-1", tunnel.ElectionUpdate, tunnel.RecordSync, "shop",
		syncRecord("shop", sync.ResourceVersion, record.Sync{HolderIdentity: "edge-1", RenewTime: t0.Add(16 * time.Second), LeaseDurationSeconds: 30}))
	if rep.Code != tunnel.LeaderExpired {
		t.Errorf("sync record 16 s after the last renewal of a 3e9 s lease: %v %s, want %v", rep.Code, rep.Message, tunnel.LeaderExpired)
	}
}
