package replica

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-edge/tether/poolstore/feed"
)

// signedJSON is a statement as the store keeps it (signature not
// checked here: the store keeps what its callers verified).
func signedJSON(t *testing.T, h feed.Header) json.RawMessage {
	t.Helper()
	hb, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(feed.Signed{H: hb, S: []byte("sig"), K: "k"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Attest takes only the root the objects hash to; the point, the mark and
// the chains survive a reopen; the point never goes back.
func TestAttestAndTrustPersisted(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := open(t, path)
	mustNil(t, s.StartEpoch("l/1"))
	mustNil(t, s.Replace(slices_, []json.RawMessage{slice("ns", "a", 5)}, 10))
	wrong := feed.Header{Kind: feed.KindAttest, Resource: slices_, To: 10, Root: feed.NewTree().Root()}
	if err := s.Attest(slices_, signedJSON(t, wrong), wrong); !errors.Is(err, ErrRootMismatch) {
		t.Fatalf("attestation of another root: %v, want ErrRootMismatch", err)
	}
	if _, ok := s.Point(slices_); ok {
		t.Fatal("a refused attestation left a point")
	}
	h := feed.Header{Kind: feed.KindAttest, Resource: slices_, To: 10, Root: s.Root(slices_)}
	mustNil(t, s.Attest(slices_, signedJSON(t, h), h))
	// Attestations are no watch event.
	if cs, _, err := s.History(slices_, 0); err != nil || len(cs) != 2 || cs[0].Type != Added || cs[1].Type != Bookmark {
		t.Fatalf("history: %+v, %v; want the object and the list's bookmark", cs, err)
	}
	at := time.Now().Truncate(time.Millisecond)
	s.SetMark(signedJSON(t, feed.Header{Kind: feed.KindMark, T: at, Resources: map[string]feed.Point{slices_: {To: 10, Root: h.Root}}}), at)
	s.SetMark(signedJSON(t, feed.Header{Kind: feed.KindMark, T: at.Add(-time.Minute)}), at.Add(-time.Minute)) // older: ignored
	s.SetChains([][][]byte{{[]byte("leaf")}})
	if !s.Covers(map[string]feed.Point{slices_: {To: 10, Root: h.Root}}) || s.Covers(map[string]feed.Point{slices_: {To: 11, Root: h.Root}}) {
		t.Fatal("Covers: wrong")
	}
	mustNil(t, s.Close())

	s = open(t, path)
	if p, ok := s.Point(slices_); !ok || p.To != 10 || p.Root != h.Root || s.Root(slices_) != h.Root {
		t.Fatalf("after a reopen: point %+v (%v), root %s", p, ok, s.Root(slices_))
	}
	if !s.SyncedAt().Equal(at) || len(s.Chains()) != 1 || s.Mark() == nil {
		t.Fatalf("after a reopen: synced %v (want %v), %d chains", s.SyncedAt(), at, len(s.Chains()))
	}
	// An older attestation of the same content (committed by a
	// follower) leaves the point where it was.
	old := feed.Header{Kind: feed.KindAttest, Resource: slices_, To: 7, Root: h.Root}
	mustNil(t, s.ApplyChanges(s.Epoch(), []Change{{Rev: s.Rev() + 1, Resource: slices_, Type: Attest, RV: 7, Object: signedJSON(t, old)}}))
	if p, _ := s.Point(slices_); p.To != 10 {
		t.Fatalf("the point went back to %d", p.To)
	}
}

// A schema 1 file (before attestations) is read: the node serves what it
// had, unattested, until the leader's first verified data replaces it.
func TestSchema1FileRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := open(t, path)
	mustNil(t, s.StartEpoch("l/1"))
	mustNil(t, s.Replace(slices_, []json.RawMessage{slice("ns", "a", 5)}, 10))
	mustNil(t, s.Close())
	db, err := bolt.Open(path, 0o600, nil)
	mustNil(t, err)
	mustNil(t, db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bucketTrust); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keySchema, []byte(schemaV1))
	}))
	mustNil(t, db.Close())

	s = open(t, path)
	if s.Len() != 1 {
		t.Fatalf("a schema 1 file read as %d objects, want 1", s.Len())
	}
	if _, ok := s.Point(slices_); ok {
		t.Fatal("a schema 1 file has no attestation")
	}
}
