package poolstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/replica"
)

// A follower applies only what a gateway signed (package feed): changes
// are held until the attestation that closes them, whose signature is
// checked against a trusted gateway chain and whose root the replica's
// objects, with the changes, must hash to; only then are they committed.
// A snapshot's objects must hash to each resource's attested root. The
// replica counts as synced only from a signed mark its points cover. A
// leader can withhold (the replica goes stale: components then read from
// the cloud), but what it forges, alters, deletes or rolls back is
// refused and never served (docs/design.md, "The node pool").

// Reasons a follower refuses what a leader sent (the "reason" label of
// tether_edge_pool_leaders_refused_total), besides those of
// replicate_follower.go.
const (
	refusedUnsigned     = "unsigned"      // data without the attestation that would close it
	refusedUnknownKey   = "unknown_key"   // signed by a key no trusted chain carries
	refusedBadSignature = "bad_signature" // a signature or statement that does not hold
	refusedBadChain     = "bad_chain"     // a certificate chain --gateway-ca does not trust
	refusedRootMismatch = "root_mismatch" // objects that do not hash to the attested root
	refusedRollback     = "rollback"      // an older attested state than the replica's
)

// maxPending bounds the changes a follower holds before an attestation
// closes them: a unit of the gateway's is at most a relist's
// differences, and the snapshot is the way for more.
const maxPending = 1 << 16

// verifier is one stream's verification state. Only Run's goroutine uses
// it.
type verifier struct {
	f       *Follower
	pending []replica.Change // since the last commit, all of one resource
	mark    json.RawMessage  // a verified mark not yet covered
	markT   time.Time
	points  map[string]feed.Point
}

// trustRefusal maps a feed error to a refusal.
func trustRefusal(err error, what string) error {
	reason := refusedBadSignature
	switch {
	case errors.Is(err, feed.ErrUnknownKey):
		reason = refusedUnknownKey
	case errors.Is(err, feed.ErrBadChain):
		reason = refusedBadChain
	}
	return &refusal{reason, fmt.Errorf("%s: %w", what, err)}
}

// open verifies a signed statement (its feed.Signed JSON) of kind.
func (v *verifier) open(raw json.RawMessage, kind string) (feed.Header, error) {
	return openSigned(v.f.o.Verifier, raw, kind)
}

// openSigned verifies with fv a signed statement (its feed.Signed JSON)
// of kind; what does not verify is a *refusal.
func openSigned(fv *feed.Verifier, raw json.RawMessage, kind string) (feed.Header, error) {
	var s feed.Signed
	if err := json.Unmarshal(raw, &s); err != nil || s.IsZero() {
		return feed.Header{}, &refusal{refusedUnsigned, fmt.Errorf("a %s that is no signed statement", kind)}
	}
	h, err := fv.OpenKind(s, kind)
	if err != nil {
		return feed.Header{}, trustRefusal(err, "a "+kind)
	}
	return h, nil
}

// trust adds the chains a leader handed on to the verifier; a chain not
// trusted is left out (what it signed will not verify).
func (v *verifier) trust(chains [][][]byte) {
	added := false
	for _, c := range chains {
		if err := v.f.o.Verifier.AddChain(c); err != nil {
			v.f.log.Debug("pool replication: gateway chain not trusted", "err", err)
			continue
		}
		added = true
	}
	if added {
		v.f.o.Store.SetChains(v.f.o.Verifier.Chains())
	}
}

// changes takes replicated changes: held until an attestation, then
// committed if it verifies.
func (v *verifier) changes(epoch string, cs []replica.Change) error {
	for _, c := range cs {
		if c.Type != replica.Attest {
			if len(v.pending) > 0 && v.pending[0].Resource != c.Resource {
				return &refusal{refusedUnsigned, fmt.Errorf("changes of %s not attested before changes of %s", v.pending[0].Resource, c.Resource)}
			}
			if len(v.pending) >= maxPending {
				return &refusal{refusedUnsigned, fmt.Errorf("more than %d changes without an attestation", maxPending)}
			}
			v.pending = append(v.pending, c)
			continue
		}
		if err := v.commit(epoch, c); err != nil {
			return err
		}
	}
	return nil
}

// commit checks attestation a against the pending changes and commits
// them with it.
func (v *verifier) commit(epoch string, a replica.Change) error {
	store := v.f.o.Store
	h, err := v.open(a.Object, feed.KindAttest)
	if err != nil {
		return err
	}
	if h.Resource != a.Resource || h.To != a.RV {
		return &refusal{refusedBadSignature, fmt.Errorf("an attestation of %s at %d carried as one of %s at %d", h.Resource, h.To, a.Resource, a.RV)}
	}
	edits := make([]feed.Edit, 0, len(v.pending))
	for _, c := range v.pending {
		if c.Resource != h.Resource {
			return &refusal{refusedUnsigned, fmt.Errorf("changes of %s closed by an attestation of %s", c.Resource, h.Resource)}
		}
		switch c.Type {
		case replica.Added, replica.Modified:
			edits = append(edits, feed.Edit{Key: feed.Key(c.Namespace, c.Name), Raw: c.Object})
		case replica.Deleted:
			edits = append(edits, feed.Edit{Key: feed.Key(c.Namespace, c.Name)})
		}
	}
	root := store.RootWith(h.Resource, edits)
	cur, has := store.Point(h.Resource)
	switch {
	case has && h.To < cur.To && root != cur.Root:
		return &refusal{refusedRollback, fmt.Errorf("%s attested at %d, older than the replica's %d", h.Resource, h.To, cur.To)}
	case has && h.To < cur.To:
		// An older attestation of the same content (a leader that moved
		// to a gateway replica a little behind): nothing changes.
	case root != h.Root:
		return &refusal{refusedRootMismatch, fmt.Errorf("%d changes of %s hash to %s, attested %s at %d", len(edits), h.Resource, root, h.Root, h.To)}
	}
	if err := v.f.checkGrowth(v.pending); err != nil {
		return err
	}
	if err := store.ApplyChanges(epoch, append(v.pending, a)); err != nil {
		if errors.Is(err, replica.ErrGap) {
			v.f.wantSnapshot = true
		}
		return fmt.Errorf("apply replicated changes: %w", err)
	}
	v.pending = v.pending[:0]
	v.retryMark()
	return nil
}

// snapshot checks a snapshot before it is loaded: every resource
// attested, its objects hashing to the attested root, none older than
// the replica's.
func (v *verifier) snapshot(snap *replica.Snapshot) error {
	v.trust(snap.Chains)
	trees := map[string]*feed.Tree{}
	for r := range snap.Resources {
		trees[r] = feed.NewTree()
	}
	for _, c := range snap.Objects {
		t := trees[c.Resource]
		if t == nil {
			return fmt.Errorf("protocol error: snapshot object of %s, a resource it does not list", c.Resource)
		}
		t.Set(feed.Key(c.Namespace, c.Name), c.Object)
	}
	for r, t := range trees {
		raw, ok := snap.Attests[r]
		if !ok {
			return &refusal{refusedUnsigned, fmt.Errorf("a snapshot of %s without its attestation", r)}
		}
		h, err := v.open(raw, feed.KindAttest)
		if err != nil {
			return err
		}
		if h.Resource != r {
			return &refusal{refusedBadSignature, fmt.Errorf("an attestation of %s given for %s", h.Resource, r)}
		}
		root := t.Root()
		if root != h.Root {
			return &refusal{refusedRootMismatch, fmt.Errorf("a snapshot of %s whose %d objects hash to %s, attested %s at %d", r, t.Len(), root, h.Root, h.To)}
		}
		if cur, has := v.f.o.Store.Point(r); has && h.To < cur.To && root != cur.Root {
			return &refusal{refusedRollback, fmt.Errorf("a snapshot of %s attested at %d, older than the replica's %d", r, h.To, cur.To)}
		}
	}
	if len(snap.Mark) > 0 {
		if _, err := v.open(snap.Mark, feed.KindMark); err != nil {
			return err
		}
	}
	return nil
}

// syncMark takes a signed mark: the replica is synced at its time once
// its points are covered.
func (v *verifier) syncMark(raw json.RawMessage) error {
	if len(raw) == 0 {
		return nil // a keepalive of a leader that has no mark yet
	}
	h, err := v.open(raw, feed.KindMark)
	if err != nil {
		return err
	}
	if len(h.Resources) == 0 {
		return &refusal{refusedBadSignature, errors.New("a mark of no resource")}
	}
	now := v.f.o.Clock.Now()
	if h.T.After(now.Add(v.f.o.MaxSyncAhead)) {
		return &refusal{refusedSyncInFuture, fmt.Errorf("a mark signed at %s, ahead of this node's clock %s by more than %s",
			h.T.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano), v.f.o.MaxSyncAhead)}
	}
	if !h.T.After(v.markT) {
		return nil // replayed, or older than one taken
	}
	v.mark, v.markT, v.points = raw, h.T, h.Resources
	v.retryMark()
	return nil
}

// retryMark marks the replica synced at the pending mark's time if the
// replica covers it.
func (v *verifier) retryMark() {
	if v.mark == nil || !v.f.o.Store.Covers(v.points) {
		return
	}
	v.f.o.Store.SetMark(v.mark, v.markT)
	v.mark, v.points = nil, nil
}
