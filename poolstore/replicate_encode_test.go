package poolstore

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tether-edge/tether/poolstore/replica"
)

// The changes frames a leader sends from its cache of encoded changes are
// byte for byte json.Marshal's, and the cache never answers with another
// epoch's or revision's change.
func TestChangesFrameIsMarshalsFrame(t *testing.T) {
	change := func(rev uint64, name, extra string) replica.Change {
		// Whitespace, HTML characters and non-ASCII, which json.Marshal
		// compacts and escapes in a RawMessage.
		obj := fmt.Sprintf(`{ "kind": "EndpointSlice", "metadata": {"namespace": "ns", "name": %q, "resourceVersion": "%d"},
			"note": "<a & b> é %s" }`, name, 100+rev, extra)
		return replica.Change{Rev: rev, Resource: "discovery.k8s.io/v1/endpointslices", Type: replica.Modified,
			Namespace: "ns", Name: name, RV: 100 + rev, Object: json.RawMessage(obj)}
	}
	want := func(epoch string, rev uint64, items []replica.Change) string {
		t.Helper()
		b, err := json.Marshal(frame{Type: frameChanges, Epoch: epoch, Rev: rev, Items: items})
		if err != nil {
			t.Fatal(err)
		}
		return string(b) + "\n"
	}
	var e encodedChanges
	check := func(what, epoch string, rev uint64, items []replica.Change) {
		t.Helper()
		got, err := e.changesFrame(epoch, rev, items)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if diff := cmp.Diff(want(epoch, rev, items), string(got)); diff != "" {
			t.Errorf("%s: frame differs from json.Marshal's (-want +got):\n%s", what, diff)
		}
	}

	items := []replica.Change{change(1, "a", "one"), change(2, "b", "two"), {Rev: 3, Resource: "core/v1/services", Type: replica.Bookmark, RV: 104}}
	check("first encoding", "node-1/1", 5, items)
	check("from the cache", "node-1/1", 7, items)
	check("one change", "node-1/1", 7, items[1:2])

	// A new term counts revisions from 1 again: its changes are not the
	// old term's.
	next := []replica.Change{change(1, "a", "new term"), change(2, "c", "new term")}
	check("another epoch, same revisions", "node-2/2", 2, next)
	// Revisions that share a slot.
	far := []replica.Change{change(1+encodedSlots, "d", "far"), change(2+encodedSlots, "e", "far")}
	check("revisions sharing slots", "node-2/2", 2+encodedSlots, far)
	check("the earlier revisions again", "node-2/2", 2, next)

	// An object too big for the cache is encoded each time, the same.
	big := []replica.Change{change(600, fmt.Sprintf("big-%0*d", encodedMaxBytes, 0), "big")}
	check("too big to cache", "node-2/2", 600, big)
	check("too big to cache, again", "node-2/2", 600, big)
	if s := e.slots[600%encodedSlots]; s.rev == 600 {
		t.Errorf("a change of %d bytes was cached (limit %d)", len(big[0].Object), encodedMaxBytes)
	}

	// Without an epoch (omitted in JSON) the splice still matches.
	check("no epoch", "", 9, []replica.Change{change(9, "f", "")})
}
