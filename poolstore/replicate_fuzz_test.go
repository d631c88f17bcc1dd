package poolstore

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/poolstore/replica"
	testclock "k8s.io/utils/clock/testing"
)

// FuzzReplicationStream feeds arbitrary bytes to the follower's side of the
// replication stream, Follower.apply itself, into a real store (one per
// fuzzing process, emptied before each input; its file is written in the
// background, as in production). Nothing may panic, every stream ends
// with an error (its end is one), and the replica stays within its bounds
// and consistent: a sync mark never ahead of the follower's clock, its
// size what its objects weigh, and its own snapshot one a follower would
// take.
func FuzzReplicationStream(f *testing.F) {
	now := time.Now()
	gw := newTestGateway(f, "gateway-ca")
	// A genuine stream: a leader's store as a gateway attests it, its
	// snapshot, then changes closed by an attestation, and marks.
	leader, err := replica.Open(filepath.Join(f.TempDir(), "leader.db"), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { leader.Close() })
	mustNil(f, leader.StartEpoch("l/1"))
	mustNil(f, leader.Replace(slices_, []json.RawMessage{slice("ns", "a", 5, "app", "x"), slice("ns", "b", 6)}, 10))
	attestStore(f, gw, leader)
	markStore(f, gw, leader, now.Add(-time.Second))
	snap := leader.Snapshot()
	rev := leader.Rev()
	mustNil(f, leader.Apply(slices_, replica.Modified, slice("ns", "a", 11)))
	mustNil(f, leader.Apply(slices_, replica.Deleted, slice("ns", "b", 12)))
	attestStore(f, gw, leader)
	changes, err := leader.Since(rev)
	mustNil(f, err)
	markStore(f, gw, leader, now)
	later := leader.Mark()
	markStore(f, gw, leader, now.Add(time.Hour))
	future := leader.Mark()

	seed := func(frames ...frame) {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		for _, fr := range frames {
			enc.Encode(fr)
		}
		f.Add(buf.Bytes())
	}
	snapshot := frame{Type: frameSnapshot, Epoch: "l/1", Rev: snap.Rev, Resources: snap.Resources, Count: len(snap.Objects),
		Attests: snap.Attests, Mark: snap.Mark, Chains: snap.Chains}
	seed(frame{Type: frameTrust, Chains: snap.Chains}, snapshot, frame{Type: frameObjects, Epoch: "l/1", Rev: snap.Rev, Items: snap.Objects},
		frame{Type: frameSync, Epoch: "l/1", Rev: snap.Rev, Mark: snap.Mark},
		frame{Type: frameChanges, Epoch: "l/1", Rev: leader.Rev(), Items: changes},
		frame{Type: frameSync, Epoch: "l/1", Rev: leader.Rev(), Mark: later})
	seed(frame{Type: frameSync, Mark: future})
	// Forged: the changes without their attestation, or altered.
	altered := slices.Clone(changes)
	altered[0].Object = slice("ns", "a", 11, "forged", "yes")
	seed(snapshot, frame{Type: frameObjects, Epoch: "l/1", Rev: snap.Rev, Items: snap.Objects},
		frame{Type: frameChanges, Epoch: "l/1", Rev: leader.Rev(), Items: altered})
	seed(frame{Type: frameSnapshot, Epoch: "l/1", Resources: map[string]uint64{slices_: 10}, Count: 9})
	seed(snapshot, frame{Type: frameObjects, Epoch: "l/1", Rev: 3, Items: []replica.Change{
		{Rev: 3, Resource: slices_, Type: replica.Added, Namespace: "ns", Name: "a", RV: 5, Object: slice("ns", "a", 5, "pad", strings.Repeat("x", 5000))}}})
	f.Add([]byte("{\"type\":\"objects\",\"items\":[{}]}\n"))

	const maxObjects, maxBytes = 8, 4 << 10
	store, err := replica.Open(filepath.Join(f.TempDir(), replica.FileName), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { store.Close() })
	// check takes the replica's snapshots, as a follower would.
	check, err := replica.Open(filepath.Join(f.TempDir(), "check.db"), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { check.Close() })
	clk := testclock.NewFakeClock(now)
	v := newVerifier(f, gw)
	fol, err := NewFollower(FollowerOptions{
		PeerConfig: PeerConfig{Self: "f", Members: &members{pools: map[string]string{}, addrs: map[string]string{}}, Clock: clk,
			Certificate: func() (*tls.Certificate, error) { return nil, errors.New("no dialling here") },
			CAs:         x509.NewCertPool},
		Store: store, Leader: func() string { return "" }, Verifier: v, MaxObjects: maxObjects, MaxBytes: maxBytes})
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, stream []byte) {
		if err := store.Load(replica.Snapshot{}); err != nil {
			t.Fatal(err)
		}
		store.MarkSynced(time.Time{})
		fol.wantSnapshot = false
		if err := fol.apply(newFrameReader(bytes.NewReader(stream))); err == nil {
			t.Fatal("apply ended without an error")
		}
		if store.Len() > maxObjects || store.Bytes() > maxBytes {
			t.Fatalf("the replica holds %d objects, %d bytes; bounds %d, %d", store.Len(), store.Bytes(), maxObjects, maxBytes)
		}
		if at := store.SyncedAt(); at.After(clk.Now().Add(fol.o.MaxSyncAhead)) {
			t.Fatalf("replica synced at %v, past the follower's clock %v and the allowance", at, clk.Now())
		}
		// Nothing the gateway did not attest: every resource's objects
		// hash to its attested root.
		for r := range store.Resources() {
			p, ok := store.Point(r)
			objs, _, _, _ := store.List(r)
			if root := store.Root(r); (ok && root != p.Root) || (!ok && len(objs) > 0) {
				t.Fatalf("%s: objects hash to %s, attested %+v (%v)", r, root, p, ok)
			}
		}
		snap := store.Snapshot()
		var size int64
		for _, c := range snap.Objects {
			size += int64(len(c.Object))
		}
		if size != store.Bytes() {
			t.Fatalf("Bytes() = %d, the objects weigh %d", store.Bytes(), size)
		}
		if err := check.Load(snap); err != nil {
			t.Fatalf("the replica's own snapshot would be refused: %v", err)
		}
	})
}
