package replica

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tether-edge/tether/poolstore/feed"
)

// Trust: what a gateway signed about the replica (package feed). Each
// resource keeps the last attestation applied to it (Change of type
// Attest) and the point it attests, its resourceVersion and the root of
// its objects; the store keeps the last signed mark and the gateway
// certificate chains that verify them, to hand on to followers in
// snapshots. A follower commits changes only up to an attestation whose
// root its objects then hash to, and counts the replica fresh only from
// a mark its points cover (poolstore/replicate_follower.go); this file
// only keeps the state.

// ErrRootMismatch: the objects do not hash to the attested root.
var ErrRootMismatch = errors.New("poolstore: objects do not match the attested root")

// readHeader reads the header of a signed statement without checking its
// signature: the store's own data, checked when it arrived.
func readHeader(raw json.RawMessage) (feed.Header, error) {
	var s feed.Signed
	if err := json.Unmarshal(raw, &s); err != nil {
		return feed.Header{}, err
	}
	var h feed.Header
	if err := json.Unmarshal(s.H, &h); err != nil {
		return feed.Header{}, err
	}
	return h, nil
}

// Attest records a verified attestation h (signed: its feed.Signed JSON)
// of resource, whose objects must hash to h.Root (leader).
func (s *Store) Attest(resource string, signed json.RawMessage, h feed.Header) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	res := s.resource(resource)
	if root := res.tree.Root(); root != h.Root {
		return fmt.Errorf("%w: %s at %d hashes to %s, attested %s", ErrRootMismatch, resource, h.To, root, h.Root)
	}
	s.record(resource, res, Change{Type: Attest, RV: h.To, Object: signed}, nil)
	s.notify()
	return nil
}

// Point returns the point resource's last attestation gives, false if it
// has none.
func (s *Store) Point(resource string) (feed.Point, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	res := s.resources[resource]
	if res == nil || res.attest == nil {
		return feed.Point{}, false
	}
	return res.at, true
}

// Root is the root of resource's objects now.
func (s *Store) Root(resource string) feed.Hash {
	return s.RootWith(resource, nil)
}

// RootWith is the root resource's objects would have after edits; the
// replica does not change.
func (s *Store) RootWith(resource string, edits []feed.Edit) feed.Hash {
	s.mu.Lock() // the tree caches bucket hashes
	defer s.mu.Unlock()
	res := s.resources[resource]
	if res == nil {
		return feed.NewTree().RootWith(edits)
	}
	return res.tree.RootWith(edits)
}

// Covers reports whether the replica is at or past every point of a
// mark: each resource attested at a later resourceVersion, or at the
// same with the same root.
func (s *Store) Covers(points map[string]feed.Point) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for r, p := range points {
		res := s.resources[r]
		if res == nil || res.attest == nil {
			return false
		}
		if res.at.To < p.To || (res.at.To == p.To && res.at.Root != p.Root) {
			return false
		}
	}
	return true
}

// SetMark records a verified mark (its feed.Signed JSON) signed at t,
// and that the replica was synced then, unless it holds a later one.
func (s *Store) SetMark(signed json.RawMessage, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !t.After(s.syncedAt) {
		return
	}
	s.mark, s.syncedAt, s.dirtyTrust = signed, t, true
	s.notify()
}

// Mark is the last mark recorded (nil if none).
func (s *Store) Mark() json.RawMessage {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.mark
}

// SetChains records the gateway certificate chains that verify the
// replica's statements (verified by the caller).
func (s *Store) SetChains(chains [][][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.chains, s.dirtyTrust = chains, true
	s.notify()
}

// Chains are the chains SetChains or a snapshot recorded.
func (s *Store) Chains() [][][]byte {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.chains
}
