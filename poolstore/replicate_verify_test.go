package poolstore

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/replica"
)

// thiefAttest appends a replayed attestation (raw, of resource at rv) to
// a leader's log, as a leader that holds a stolen key but not the
// gateway's can: through the follower's API on its own store.
func thiefAttest(t *testing.T, s *replica.Store, resource string, rv uint64, raw json.RawMessage) {
	t.Helper()
	mustNil(t, s.ApplyChanges(s.Epoch(), []replica.Change{{Rev: s.Rev() + 1, Resource: resource, Type: replica.Attest, RV: rv, Object: raw}}))
}

// lastAttest is the attestation the gateway last gave resource in s.
func lastAttest(t *testing.T, s *replica.Store, resource string) (json.RawMessage, uint64) {
	t.Helper()
	snap := s.Snapshot()
	raw := snap.Attests[resource]
	if raw == nil {
		t.Fatalf("%s not attested", resource)
	}
	p, _ := s.Point(resource)
	return raw, p.To
}

// A leader that adds, alters or deletes objects and closes the change
// with a genuine attestation of another state is refused: the follower's
// replica hashes to what the gateway attested, never to the forgery.
func TestFollowerRefusesForgedChanges(t *testing.T) {
	for _, tc := range []struct {
		name  string
		forge func(s *replica.Store) error
	}{
		{"added", func(s *replica.Store) error {
			return s.Apply(slices_, replica.Added, slice("default", "kubernetes", 11))
		}},
		{"altered", func(s *replica.Store) error {
			return s.Replace(slices_, []json.RawMessage{slice("ns", "a", 5, "forged", "yes"), slice("ns", "b", 6)}, 10)
		}},
		{"deleted", func(s *replica.Store) error {
			return s.Apply(slices_, replica.Deleted, slice("ns", "b", 11))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			l, f := c.addNode("l", "a"), c.addNode("f", "a")
			l.lead("l/1")
			mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("ns", "a", 5), slice("ns", "b", 6)}, 10))
			converged(t, l, f)
			digest := f.store.Digest()
			raw, to := lastAttest(t, l.store, slices_)

			mustNil(t, tc.forge(l.store))
			thiefAttest(t, l.store, slices_, to, raw)
			refused := f.follower.m.refused.WithLabelValues(refusedRootMismatch)
			testenv.Eventually(t, "the forgery refused", func() bool { return value(refused) >= 1 })
			if f.store.Digest() != digest {
				t.Fatalf("the follower's replica changed to the leader's forgery")
			}
			if p, _ := f.store.Point(slices_); f.store.Root(slices_) != p.Root {
				t.Fatal("the follower's objects do not hash to its attested root")
			}
		})
	}
}

// A change the gateway attests later still reaches the follower, with
// forged changes left pending before it refused, not applied.
func TestForgedChangeNeverServedWhilePending(t *testing.T) {
	c := newCluster(t)
	l, f := c.addNode("l", "a"), c.addNode("f", "a")
	l.lead("l/1")
	mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("ns", "a", 5)}, 10))
	converged(t, l, f)
	// No attestation after it: the follower holds it and serves nothing
	// of it, however long.
	mustNil(t, l.store.Apply(slices_, replica.Added, slice("default", "kubernetes", 11)))
	received := f.follower.m.frames.WithLabelValues(frameChanges)
	before := value(received)
	testenv.Never(t, "the unattested change served", func() bool {
		objs, _, _, _ := f.store.List(slices_)
		return len(objs) != 1
	}, func() bool { return value(received) > before })
}

// A leader whose data is signed by a key --gateway-ca does not trust
// (its own CA, a forger's) gets nothing into the replica.
func TestFollowerRefusesUntrustedSigner(t *testing.T) {
	c := newCluster(t)
	l := c.addNode("l", "a")
	l.lead("l/1")
	mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("default", "kubernetes", 5)}, 10))
	forger := newTestGateway(t, "forger-ca")
	attestStore(t, forger, l.store)
	markStore(t, forger, l.store, time.Now())
	store := open(t, filepath.Join(t.TempDir(), replica.FileName))
	f := c.follower("f", "a", store, FollowerOptions{})
	testenv.Eventually(t, "the forger's snapshot refused", func() bool {
		return value(f.m.refused.WithLabelValues(refusedUnknownKey)) >= 1
	})
	if store.Len() != 0 || !store.SyncedAt().IsZero() {
		t.Fatalf("the replica took %d objects, synced at %v", store.Len(), store.SyncedAt())
	}
}

// A leader that replays old marks, or that withholds the changes a new
// mark covers, cannot keep a follower's replica fresh.
func TestFreshOnlyFromACoveredMark(t *testing.T) {
	c := newCluster(t)
	l, f := c.addNode("l", "a"), c.addNode("f", "a")
	l.lead("l/1")
	mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("ns", "a", 5)}, 10))
	c.attest(l)
	old := time.Now().Add(-time.Minute)
	c.mark(l, old)
	converged(t, l, f)
	testenv.Eventually(t, "the follower synced at the mark", func() bool { return f.store.SyncedAt().Equal(old) })

	// The gateway marks a state the leader withholds: a mark of a later
	// point that the follower's replica does not reach.
	shadow := open(t, filepath.Join(t.TempDir(), "shadow.db"))
	mustNil(t, shadow.StartEpoch("gw"))
	mustNil(t, shadow.Replace(slices_, []json.RawMessage{slice("ns", "a", 5), slice("ns", "new", 20)}, 20))
	attestStore(t, c.gw, shadow)
	markStore(t, c.gw, shadow, time.Now())
	l.store.SetMark(shadow.Mark(), time.Now()) // the leader relays the mark, not the change
	received := f.follower.m.frames.WithLabelValues(frameSync)
	before := value(received)
	testenv.Never(t, "the follower fresh from a mark it does not reach", func() bool {
		return !f.store.SyncedAt().Equal(old)
	}, func() bool { return value(received) > before+2 })
}

// A snapshot of an older attested state than the follower holds (a
// leader serving what it had before) is refused; the replica keeps the
// newer one.
func TestSnapshotRollbackRefused(t *testing.T) {
	c := newCluster(t)
	old := open(t, filepath.Join(t.TempDir(), "old.db"))
	mustNil(t, old.StartEpoch("x/1"))
	mustNil(t, old.Replace(slices_, []json.RawMessage{slice("ns", "a", 5)}, 10))
	attestStore(t, c.gw, old)

	l := c.addNode("l", "a")
	l.lead("l/1")
	mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("ns", "a", 5), slice("ns", "b", 15)}, 20))
	c.attest(l)
	store := open(t, filepath.Join(t.TempDir(), replica.FileName))
	f := c.follower("f", "a", store, FollowerOptions{})
	testenv.Eventually(t, "the follower has the newer state", func() bool { return store.Digest() == l.store.Digest() })
	digest := store.Digest()

	// The leader's replica goes back to the older genuine state, in a
	// new term (a node leading again with what it had before). Not a
	// new node: its own follower would race the Load for l's newer
	// state.
	mustNil(t, l.store.Load(old.Snapshot()))
	l.lead("l/2")
	testenv.Eventually(t, "the rollback refused", func() bool { return value(f.m.refused.WithLabelValues(refusedRollback)) >= 1 })
	if store.Digest() != digest {
		t.Fatal("the replica went back to the older state")
	}
}

// A replica's attestations, mark and gateway chains survive a restart:
// what it holds still verifies with no gateway in reach.
func TestTrustSurvivesRestart(t *testing.T) {
	c := newCluster(t)
	l, f := c.addNode("l", "a"), c.addNode("f", "a")
	l.lead("l/1")
	mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("ns", "a", 5)}, 10))
	c.attest(l)
	at := time.Now()
	c.mark(l, at)
	converged(t, l, f)
	testenv.Eventually(t, "the mark", func() bool { return f.store.SyncedAt().Equal(at) })
	want, _ := f.store.Point(slices_)
	c.setLeader("")
	f.stop()
	f.start()
	if got, ok := f.store.Point(slices_); !ok || got != want {
		t.Fatalf("after a restart the replica is at %+v (%v), was %+v", got, ok, want)
	}
	if !f.store.SyncedAt().Equal(at) || len(f.store.Chains()) != 1 {
		t.Fatalf("after a restart: synced at %v, %d chains", f.store.SyncedAt(), len(f.store.Chains()))
	}
	// The follower's verifier was seeded from the file: the leader's
	// snapshot, made of what the follower persisted, verifies.
	v := &verifier{f: f.follower}
	snap := f.store.Snapshot()
	if err := v.snapshot(&snap); err != nil {
		t.Fatalf("the replica's own snapshot after a restart: %v", err)
	}
}

// Asked who leads while the cloud is away, peers are ranked by the mark
// they hold, verified: a claimed time, a mark another key signed, or one
// from the future ranks last.
func TestPeersRankedByVerifiedMark(t *testing.T) {
	c := newCluster(t)
	v := c.verifier()
	mustNil(t, v.AddChain(c.gw.kp.TLS.Certificate)) // as the node's replica taught it
	p := &Pool{o: Options{Verifier: v}, follower: &Follower{o: FollowerOptions{MaxSyncAhead: time.Minute}}}
	s := open(t, filepath.Join(t.TempDir(), replica.FileName))
	mustNil(t, s.StartEpoch("x/1"))
	mustNil(t, s.Replace(slices_, []json.RawMessage{slice("ns", "a", 5)}, 10))
	attestStore(t, c.gw, s)
	at := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	markStore(t, c.gw, s, at)
	genuine := s.Mark()
	if got := p.verifiedMark(LeaderInfo{Node: "x", Leader: "x", SyncedAt: time.Now().Add(time.Hour), Mark: genuine}); !got.Equal(at) {
		t.Fatalf("a genuine mark ranks at %v, want its own time %v (not the claimed syncedAt)", got, at)
	}
	forger := newTestGateway(t, "forger-ca")
	markStore(t, forger, s, time.Now())
	if got := p.verifiedMark(LeaderInfo{Node: "y", Leader: "y", Mark: s.Mark()}); !got.IsZero() {
		t.Fatalf("a mark of an untrusted key ranks at %v", got)
	}
	if got := p.verifiedMark(LeaderInfo{Node: "z", Leader: "z", SyncedAt: time.Now()}); !got.IsZero() {
		t.Fatalf("a claimed time without a mark ranks at %v", got)
	}
	future := c.gw.sign(t, feed.Header{Kind: feed.KindMark, T: time.Now().Add(time.Hour), Resources: map[string]feed.Point{}})
	if got := p.verifiedMark(LeaderInfo{Node: "f", Leader: "f", Mark: future}); !got.IsZero() {
		t.Fatalf("a mark an hour ahead ranks at %v", got)
	}
}
