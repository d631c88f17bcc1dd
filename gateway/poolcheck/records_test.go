package poolcheck

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/gateway/internal/pooltest"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// counting counts the requests a client makes.
type counting struct {
	rt http.RoundTripper
	n  atomic.Int64
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.rt.RoundTrip(r)
}

// TestRecordCache: the election records come from the informer, with the
// gateway's RBAC, against a real kube-apiserver: Unavailable (and not
// ready) before it has synced, then the records as the apiserver has
// them, trimmed, with no request per check.
func TestRecordCache(t *testing.T) {
	pc := pooltest.Start(t, pooltest.Options{Pools: map[string]string{"edge-1": "shop", "edge-2": "shop"}})
	cfg := pc.RESTConfig(pc.GatewayCert)
	reqs := &counting{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { reqs.rt = rt; return reqs })
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rc := NewRecordCache(client, 0, nil)
	check := Checker{Nodes: pools, Records: rc}
	ref := record.Namespace + "/" + record.ElectionName("shop")

	// Not synced: Unavailable, not ready.
	if rc.Ready() == nil {
		t.Error("Ready before Run: nil, want not synced")
	}
	checkRefusal(t, "Leader before sync", check.Leader(pc.Ctx, "edge-1", "shop", time.Now()), tunnel.Unavailable,
		"read election record "+ref+": "+ErrRecordsNotSynced.Error())

	ctx, cancel := context.WithCancel(pc.Ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := rc.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	if err := rc.WaitSynced(pc.Ctx); err != nil {
		t.Fatal(err)
	}
	if err := rc.Ready(); err != nil {
		t.Errorf("Ready after sync: %v", err)
	}
	checkRefusal(t, "Leader without a record", check.Leader(pc.Ctx, "edge-1", "shop", time.Now()), tunnel.NotLeader,
		"pool shop has no leader (election record "+ref+")")

	// poolstore's real election; the informer sees its record.
	stop := pc.Elect("shop", "edge-1")
	testenv.Eventually(t, "the cache sees edge-1 lead shop", func() bool {
		return check.Leader(pc.Ctx, "edge-1", "shop", time.Now()) == nil
	})
	before := reqs.n.Load()
	for range 100 {
		if err := check.Leader(pc.Ctx, "edge-1", "shop", time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := check.Leader(pc.Ctx, "edge-2", "shop", time.Now()); codeOf(err) != tunnel.NotLeader {
			t.Fatalf("edge-2: %v, want not_leader", err)
		}
	}
	if n := reqs.n.Load() - before; n != 0 {
		t.Errorf("200 checks made %d requests to the apiserver, want 0", n)
	}

	// Trimmed: the election annotation and the identity, nothing else.
	cms := pc.Client.CoreV1().ConfigMaps(record.Namespace)
	syncRec := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.SyncName("shop"), Labels: map[string]string{"a": "b"}},
		Data: record.Sync{HolderIdentity: "edge-1", RenewTime: time.Now(), LeaseDurationSeconds: 15}.Data()}
	if _, err := cms.Create(pc.Ctx, syncRec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the cache holds the sync record", func() bool {
		_, err := rc.Get(pc.Ctx, record.SyncName("shop"), metav1.GetOptions{})
		return err == nil
	})
	got, _ := rc.Get(pc.Ctx, record.SyncName("shop"), metav1.GetOptions{})
	if got.Data != nil || got.Labels != nil || got.Annotations != nil || got.ManagedFields != nil || got.ResourceVersion == "" {
		t.Errorf("cached sync record not trimmed: %+v", got)
	}
	got, err = rc.Get(pc.Ctx, record.ElectionName("shop"), metav1.GetOptions{})
	if err != nil || len(got.Annotations) != 1 || got.Annotations[record.ElectionAnnotation] == "" || got.ManagedFields != nil {
		t.Errorf("cached election record: %+v, %v; want its annotation only", got, err)
	}

	// Released, then deleted: no leader.
	stop()
	testenv.Eventually(t, "the cache sees the release", func() bool {
		return codeOf(check.Leader(pc.Ctx, "edge-1", "shop", time.Now())) == tunnel.NotLeader
	})
	if err := cms.Delete(pc.Ctx, record.ElectionName("shop"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the cache sees the delete", func() bool {
		_, err := rc.Get(pc.Ctx, record.ElectionName("shop"), metav1.GetOptions{})
		return err != nil
	})
	checkRefusal(t, "Leader after delete", check.Leader(pc.Ctx, "edge-1", "shop", time.Now()), tunnel.NotLeader,
		"pool shop has no leader (election record "+ref+")")
}

// codeOf is err's refusal code, OK for nil.
func codeOf(err error) tunnel.Code {
	if r := AsRefusal(err); r != nil {
		return r.Code
	}
	return tunnel.OK
}
