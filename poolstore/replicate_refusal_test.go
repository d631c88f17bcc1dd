package poolstore

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	testclock "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/replica"
)

// A follower replicates only from a leader its own trusted view places in
// its pool: it checks before it connects, on every leader change and
// while it streams; a refused leader is counted and logged once, and no
// connection is made.
func TestFollowerVerifiesLeaderMembership(t *testing.T) {
	for _, tc := range []struct {
		name         string
		leader, self string // pools in the follower's view ("" none)
		reason       string
	}{
		{"leader in another pool", "b", "a", refusedOtherPool},
		{"leader in no pool", "", "a", refusedUnknownNode},
		{"own pool unknown", "a", "", refusedNoPool},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			l := c.addNode("l", "a") // the leader and its server see f as a member of a
			l.lead("l/1")
			mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("ns", "a", 5)}, 10))
			c.attest(l)

			v := &view{Members: c.members, pools: map[string]string{"l": tc.leader, "f": tc.self}}
			clk := testclock.NewFakeClock(time.Now())
			var logs testenv.LogBuffer
			store := open(t, filepath.Join(t.TempDir(), replica.FileName))
			f := c.follower("f", "a", store, FollowerOptions{PeerConfig: PeerConfig{Members: v, Clock: clk, Logger: slog.New(slog.NewTextHandler(&logs, nil))}})
			refused := f.m.refused.WithLabelValues(tc.reason)

			testenv.Eventually(t, "the refusal is counted", func() bool { return value(refused) == 1 })
			for range 5 { // the follower looks again at each CheckInterval
				testenv.Eventually(t, "the follower waits", clk.HasWaiters)
				clk.Step(10 * time.Millisecond)
			}
			testenv.Eventually(t, "the follower waits", clk.HasWaiters)
			if n := value(refused); n != 1 {
				t.Fatalf("refusals counted %v, want 1 for one leader", n)
			}
			if n := strings.Count(logs.String(), "pool leader refused"); n != 1 {
				t.Fatalf("refusal logged %d times, want once:\n%s", n, logs.String())
			}
			if st := f.Status(); st.Connected || st.LastError == "" {
				t.Fatalf("status %+v", st)
			}
			if n := value(l.server.m.frames.WithLabelValues(frameSnapshot)); n != 0 {
				t.Fatalf("the leader sent %v snapshots to a follower that refused it", n)
			}
			if err := f.DelegateToLeader(context.Background(), leaseOf(t, "f", "kube-node-lease")); err == nil {
				t.Fatal("the node's Lease was sent to a leader it refuses")
			}

			// Once the view agrees, it follows; when it no longer does, the
			// stream ends and the refusal counts again.
			v.set("l", "a")
			v.set("f", "a")
			for store.Rev() != l.store.Rev() {
				testenv.Eventually(t, "the follower waits", clk.HasWaiters)
				clk.Step(10 * time.Millisecond)
			}
			if !f.Status().Connected {
				t.Fatalf("not connected: %+v", f.Status())
			}
			v.set("l", tc.leader)
			v.set("f", tc.self)
			for f.Status().Connected {
				testenv.Eventually(t, "the follower waits", clk.HasWaiters)
				clk.Step(10 * time.Millisecond)
			}
			testenv.Eventually(t, "the second refusal is counted", func() bool { return value(refused) == 2 })
		})
	}
}

// The client checks that the peer it reached is the node it asked for
// (TestClientVerifiesPeer); this is what the follower streams from.
func TestFollowerStreamsFromNamedLeaderOnly(t *testing.T) {
	c := newCluster(t)
	impostor := c.addNode("x", "a")
	impostor.lead("x/1")
	mustNil(t, impostor.store.Replace(slices_, []json.RawMessage{slice("ns", "forged", 5)}, 10))
	// The leader l's address leads to x, which leads too, but its
	// certificate names x.
	addr, _ := c.members.Address("x")
	c.members.set("l", "a", addr)
	c.setLeader("l")
	store := open(t, filepath.Join(t.TempDir(), replica.FileName))
	f := c.follower("f", "a", store, FollowerOptions{})
	testenv.Eventually(t, "the follower says why", func() bool { return strings.Contains(f.Status().LastError, "is node x, not l") })
	if store.Len() != 0 || value(impostor.server.m.frames.WithLabelValues(frameSnapshot)) != 0 {
		t.Fatalf("the replica took %d objects from an impostor", store.Len())
	}
}

// preload fills a follower's replica with n objects of an old term.
func preload(t *testing.T, n int) *replica.Store {
	t.Helper()
	s := open(t, filepath.Join(t.TempDir(), replica.FileName))
	snap := replica.Snapshot{Epoch: "old/1", Rev: 3, Resources: map[string]uint64{slices_: uint64(n)}}
	for i := range n {
		snap.Objects = append(snap.Objects, replica.Change{Rev: 3, Resource: slices_, Type: replica.Added, Namespace: "ns",
			Name: fmt.Sprint("old", i), RV: uint64(i + 1), Object: slice("ns", fmt.Sprint("old", i), uint64(i+1))})
	}
	mustNil(t, s.Load(snap))
	return s
}

// A leader cannot make a follower hold more than its bounds: the stream
// ends, counted by reason, and the replica is what it was (never part of
// a snapshot).
func TestReplicaBounds(t *testing.T) {
	big := func(name string, rv uint64) json.RawMessage {
		return slice("ns", name, rv, "pad", strings.Repeat("x", 2000))
	}
	for _, tc := range []struct {
		name    string
		o       FollowerOptions
		objects int // the leader's
		reason  string
	}{
		{"snapshot of too many objects", FollowerOptions{MaxObjects: 50}, 51, refusedTooManyObjects},
		// 600 objects of ~2 KB: several frames of objects before the bound.
		{"snapshot of too many bytes", FollowerOptions{MaxBytes: 1 << 20}, 600, refusedTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			l := c.addNode("l", "a")
			l.lead("l/1")
			var items []json.RawMessage
			for i := range tc.objects {
				items = append(items, big(fmt.Sprint("s", i), uint64(i+1)))
			}
			mustNil(t, l.store.Replace(slices_, items, uint64(tc.objects)))
			c.attest(l)
			store := preload(t, 3)
			digest := store.Digest()
			f := c.follower("f", "a", store, tc.o)
			refused := f.m.refused.WithLabelValues(tc.reason)
			testenv.Eventually(t, "the refusal is counted", func() bool { return value(refused) >= 2 }) // and again after reconnecting
			if store.Digest() != digest || store.Epoch() != "old/1" || f.Status().Resyncs != 0 {
				t.Fatalf("the replica changed: %d objects, epoch %q", store.Len(), store.Epoch())
			}
			// The status says why between a refusal and the next connection,
			// which clears it: watch for it rather than read it once.
			testenv.Eventually(t, "the follower's status says why", func() bool {
				return strings.Contains(f.Status().LastError, "more than")
			})
		})
	}

	t.Run("changes past the bounds", func(t *testing.T) {
		c := newCluster(t)
		l := c.addNode("l", "a")
		l.lead("l/1")
		mustNil(t, l.store.Replace(slices_, []json.RawMessage{big("a", 1)}, 1))
		c.attest(l)
		store := open(t, filepath.Join(t.TempDir(), replica.FileName))
		f := c.follower("f", "a", store, FollowerOptions{MaxObjects: 5, MaxBytes: 9000})
		testenv.Eventually(t, "the follower has the leader's", func() bool { return store.Rev() == l.store.Rev() })

		mustNil(t, l.store.Apply(slices_, replica.Added, big("b", 2))) // two objects, ~4 KB: taken
		c.attest(l)
		testenv.Eventually(t, "the follower has the leader's", func() bool { return store.Rev() == l.store.Rev() })
		mustNil(t, l.store.Apply(slices_, replica.Added, big("c", 3))) // ~6 KB
		mustNil(t, l.store.Apply(slices_, replica.Added, big("d", 4))) // ~8 KB
		mustNil(t, l.store.Apply(slices_, replica.Added, big("e", 5))) // ~10 KB: past 9000
		c.attest(l)
		testenv.Eventually(t, "the refusal is counted", func() bool { return value(f.m.refused.WithLabelValues(refusedTooLarge)) >= 1 })
		if store.Bytes() > 9000 || store.Len() > 4 {
			t.Fatalf("the replica holds %d objects, %d bytes", store.Len(), store.Bytes())
		}
	})

	t.Run("changes past the count", func(t *testing.T) {
		c := newCluster(t)
		l := c.addNode("l", "a")
		l.lead("l/1")
		mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("ns", "a", 1)}, 1))
		c.attest(l)
		store := open(t, filepath.Join(t.TempDir(), replica.FileName))
		f := c.follower("f", "a", store, FollowerOptions{MaxObjects: 5, MaxBytes: 9000})
		testenv.Eventually(t, "the follower has the leader's", func() bool { return store.Rev() == l.store.Rev() })
		for i := range 10 {
			mustNil(t, l.store.Apply(slices_, replica.Added, slice("ns", fmt.Sprint("small", i), uint64(2+i))))
		}
		c.attest(l)
		testenv.Eventually(t, "the count refusal", func() bool { return value(f.m.refused.WithLabelValues(refusedTooManyObjects)) >= 1 })
		if store.Len() > 5 {
			t.Fatalf("the replica holds %d objects, more than 5", store.Len())
		}
	})
}

// A signed mark ahead of the follower's clock by more than MaxSyncAhead
// ends the stream: a gateway's clock far ahead cannot make a replica look
// fresh for long.
func TestSyncFromTheFutureRefused(t *testing.T) {
	c := newCluster(t)
	l := c.addNode("l", "a")
	l.lead("l/1")
	mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("ns", "a", 5)}, 10))
	c.attest(l)
	store := open(t, filepath.Join(t.TempDir(), replica.FileName))
	f := c.follower("f", "a", store, FollowerOptions{})
	refused := f.m.refused.WithLabelValues(refusedSyncInFuture)

	// Within the allowance (a gateway's clock a little ahead): taken.
	ahead := time.Now().Add(30 * time.Second)
	c.mark(l, ahead)
	testenv.Eventually(t, "the mark is taken", func() bool { return store.SyncedAt().Equal(ahead) })

	c.mark(l, time.Now().Add(24*time.Hour))
	testenv.Eventually(t, "the refusal is counted", func() bool { return value(refused) >= 1 })
	if at := store.SyncedAt(); !at.Equal(ahead) {
		t.Fatalf("replica synced at %v after a mark from the future, was %v", at, ahead)
	}
}

// A follower whose file was damaged starts empty and gets the leader's
// snapshot, as any new follower.
func TestDamagedReplicaRebuiltFromLeader(t *testing.T) {
	c := newCluster(t)
	l, f := c.addNode("l", "a"), c.addNode("f", "a")
	l.lead("l/1")
	var items []json.RawMessage
	for i := range 500 {
		items = append(items, slice("ns", fmt.Sprint("s", i), uint64(i+1)))
	}
	mustNil(t, l.store.Replace(slices_, items, 500))
	converged(t, l, f)
	f.stop()
	good, err := os.ReadFile(f.path)
	mustNil(t, err)
	mustNil(t, os.WriteFile(f.path, good[:len(good)/2], 0o600))
	f.start()
	converged(t, l, f)
	if st := f.follower.Status(); st.Resyncs != 1 {
		t.Fatalf("resyncs %d, want 1 (a snapshot)", st.Resyncs)
	}
	if aside, _ := filepath.Glob(f.path + ".corrupt-*"); len(aside) != 1 {
		t.Fatalf("files aside: %v", aside)
	}
}
