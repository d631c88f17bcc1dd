package poolstore

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"path/filepath"
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
	a, b := slice("ns", "a", 5, "app", "x"), slice("ns", "b", 6)
	objects := []replica.Change{{Rev: 3, Resource: slices_, Type: replica.Added, Namespace: "ns", Name: "a", RV: 5, Object: a},
		{Rev: 3, Resource: slices_, Type: replica.Added, Namespace: "ns", Name: "b", RV: 6, Object: b}}
	now := time.Unix(1e9, 0)
	seed := func(frames ...frame) {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		for _, fr := range frames {
			enc.Encode(fr)
		}
		f.Add(buf.Bytes())
	}
	snapshot := frame{Type: frameSnapshot, Epoch: "l/1", Rev: 3, Resources: map[string]uint64{slices_: 10}, Count: 2}
	seed(snapshot, frame{Type: frameObjects, Epoch: "l/1", Rev: 3, Items: objects},
		frame{Type: frameSync, Epoch: "l/1", Rev: 3, SyncedAt: now.Add(-time.Second), AgeMillis: 5},
		frame{Type: frameChanges, Epoch: "l/1", Rev: 6, Items: []replica.Change{
			{Rev: 4, Resource: slices_, Type: replica.Modified, Namespace: "ns", Name: "a", RV: 11, Object: slice("ns", "a", 11)},
			{Rev: 5, Resource: slices_, Type: replica.Deleted, Namespace: "ns", Name: "b", RV: 12, Object: b},
			{Rev: 6, Resource: slices_, Type: replica.Bookmark, RV: 13}}})
	seed(frame{Type: frameSync, SyncedAt: now.Add(time.Hour)})
	seed(frame{Type: frameSync, SyncedAt: now, AgeMillis: -60_000})
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
	check, err := replica.Open(filepath.Join(f.TempDir(), replica.FileName), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { check.Close() })
	clk := testclock.NewFakeClock(now)
	fol, err := NewFollower(FollowerOptions{
		PeerConfig: PeerConfig{Self: "f", Members: &members{pools: map[string]string{}, addrs: map[string]string{}}, Clock: clk,
			Certificate: func() (*tls.Certificate, error) { return nil, errors.New("no dialling here") },
			CAs:         x509.NewCertPool},
		Store: store, Leader: func() string { return "" }, MaxObjects: maxObjects, MaxBytes: maxBytes})
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
		if at := store.SyncedAt(); at.After(clk.Now()) {
			t.Fatalf("replica synced at %v, after the follower's clock %v", at, clk.Now())
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
