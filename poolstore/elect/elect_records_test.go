package elect

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/poolstore/record"
)

// gatewayRecords stands for the gateway: it writes the records into cms
// and remembers each write; while unreachable every write fails, as with
// no gateway connected, while the reads still reach the cloud.
type gatewayRecords struct {
	cms *memConfigMaps

	mu          sync.Mutex
	unreachable bool
	writes      []record.Write
}

var errNoGateway = errors.New("not connected to any gateway")

func (g *gatewayRecords) WriteRecord(ctx context.Context, w record.Write) (*corev1.ConfigMap, error) {
	g.mu.Lock()
	g.writes = append(g.writes, record.Write{Kind: w.Kind, Pool: w.Pool, Create: w.Create, ConfigMap: w.ConfigMap.DeepCopy()})
	down := g.unreachable
	g.mu.Unlock()
	if down {
		return nil, errNoGateway
	}
	return record.ClientWriter{ConfigMaps: g.cms}.WriteRecord(ctx, w)
}

func (g *gatewayRecords) setUnreachable(v bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.unreachable = v
}

// written returns the writes so far (kind, pool, create, name and the
// resourceVersion each was based on) and forgets them.
func (g *gatewayRecords) written() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, w := range g.writes {
		op := "update"
		if w.Create {
			op = "create"
		}
		out = append(out, op+" "+[]string{"", "election", "sync"}[w.Kind]+" "+w.Pool+" "+w.ConfigMap.Namespace+"/"+w.ConfigMap.Name+"@"+w.ConfigMap.ResourceVersion)
	}
	g.writes = nil
	return out
}

// TestElectorWritesThroughRecords: every write of the record goes through
// the record.Writer, as the pool's election record, each update on the
// resourceVersion last stored; when the writer fails (no gateway) while
// the record can still be read, the leader stops leading RenewDeadline
// later, and leads again once writes go through.
func TestElectorWritesThroughRecords(t *testing.T) {
	cms := &memConfigMaps{}
	gw := &gatewayRecords{cms: cms}
	f := startFakeWith(t, cms, Options{Pool: "p1", Node: "a"}, gw)
	f.wantLeader("a", true)
	f.step(2 * time.Second)
	f.step(2 * time.Second)
	// Taken at +0 and renewed at once (the term's first renewal), then
	// every RetryPeriod.
	want := []string{"create election p1 tether-system/pool-p1@", "update election p1 tether-system/pool-p1@1",
		"update election p1 tether-system/pool-p1@2", "update election p1 tether-system/pool-p1@3"}
	if diff := cmp.Diff(want, gw.written()); diff != "" {
		t.Fatalf("writes (-want +got):\n%s", diff)
	}
	wantRecord(t, cms, record.Election{HolderIdentity: "a", LeaseDurationSeconds: 15, AcquireTime: at(0), RenewTime: at(4 * time.Second)})

	gw.setUnreachable(true)
	for range 5 { // +6 s to +14 s: renewals fail within the deadline
		f.step(2 * time.Second)
		f.wantLeader("a", true)
	}
	f.step(2 * time.Second) // +16 s: RenewDeadline after the first failed renewal
	f.wantLeader("", false)
	if got := cms.record(t).HolderIdentity; got != "a" {
		t.Fatalf("holder %q; the record was written while no write could go through", got)
	}
	gw.setUnreachable(false)
	f.step(maxRetry)
	f.wantLeader("a", true)
}

// TestElectorFollowOnly: an elector that may not write never does: it
// creates no record, renews none that names it, and reports the holder
// others elect.
func TestElectorFollowOnly(t *testing.T) {
	cms := &memConfigMaps{}
	gw := &gatewayRecords{cms: cms}
	f := startFakeWith(t, cms, Options{Pool: "p1", Node: "a", FollowOnly: true}, gw)
	for range 3 {
		f.step(maxRetry)
		f.wantLeader("", false)
	}
	if _, err := cms.Get(context.Background(), record.ElectionName("p1"), metav1.GetOptions{}); err == nil {
		t.Fatal("a follower created the election record")
	}
	cms.put(t, record.Election{HolderIdentity: "b", LeaseDurationSeconds: 15, AcquireTime: at(0), RenewTime: at(0)})
	f.step(maxRetry)
	f.wantLeader("b", false)
	// Long expired, or naming this node: still not written.
	for range 10 {
		f.step(maxRetry)
	}
	f.wantLeader("b", false)
	cms.put(t, record.Election{HolderIdentity: "a", LeaseDurationSeconds: 15, AcquireTime: at(0), RenewTime: at(0)})
	for range 10 {
		f.step(maxRetry)
	}
	if w := gw.written(); len(w) != 0 {
		t.Fatalf("a follower wrote: %q", w)
	}
	if _, leading := f.e.Leader(); leading {
		t.Fatal("a follower leads")
	}
}
