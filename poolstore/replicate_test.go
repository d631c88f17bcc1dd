package poolstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"runtime"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/replica"
)

func TestFollowersConverge(t *testing.T) {
	c := newCluster(t)
	l, f1, f2 := c.addNode("l", "a"), c.addNode("f1", "a"), c.addNode("f2", "a")
	l.lead("l/1")
	mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("ns", "a", 5), slice("ns", "b", 6)}, 10))
	syncedAt := time.Now().Add(-5 * time.Second)
	c.attest(l)
	c.mark(l, syncedAt)
	converged(t, l, f1, f2)

	mustNil(t, l.store.Apply(slices_, replica.Modified, slice("ns", "a", 11)))
	mustNil(t, l.store.Apply(slices_, replica.Deleted, slice("ns", "b", 12)))
	for i := range 50 {
		mustNil(t, l.store.Apply(slices_, replica.Added, slice("other", fmt.Sprint("s", i), uint64(13+i))))
	}
	converged(t, l, f1, f2)

	for _, f := range []*node{f1, f2} {
		st := f.follower.Status()
		if !st.Connected || st.Leader != "l" || st.Resyncs != 1 || st.Lag != 0 || f.store.Epoch() != "l/1" {
			t.Errorf("%s: status %+v, epoch %q; want connected to l, one resync, no lag", f.name, st, f.store.Epoch())
		}
		// Synced when the gateway's mark says.
		if !f.store.SyncedAt().Equal(syncedAt) {
			t.Errorf("%s: synced at %v, leader's %v", f.name, f.store.SyncedAt(), syncedAt)
		}
		if n := value(f.follower.m.frames.WithLabelValues(frameChanges)); n == 0 {
			t.Errorf("%s: no changes frame counted", f.name)
		}
	}
	if n := value(l.server.m.streams); n != 2 {
		t.Errorf("leader serves %v streams, want 2", n)
	}
}

func TestFollowerRestartResumesOrResyncs(t *testing.T) {
	c := newCluster(t)
	l, f := c.addNode("l", "a"), c.addNode("f", "a")
	l.lead("l/1")
	mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("ns", "a", 5)}, 10))
	converged(t, l, f)

	// Restarted while the leader's log covers its revision: it resumes.
	f.stop()
	for i := range 10 {
		mustNil(t, l.store.Apply(slices_, replica.Added, slice("ns", fmt.Sprint("r", i), uint64(20+i))))
	}
	f.start()
	converged(t, l, f)
	if st := f.follower.Status(); st.Resyncs != 0 {
		t.Fatalf("after a restart within the log: %d resyncs, want 0 (resumed)", st.Resyncs)
	}

	// A new term: the stream ends, the follower reconnects with the old
	// epoch and gets a snapshot.
	l.lead("l/2")
	mustNil(t, l.store.Apply(slices_, replica.Added, slice("ns", "new", 40)))
	converged(t, l, f)
	if st := f.follower.Status(); st.Resyncs != 1 || f.store.Epoch() != "l/2" {
		t.Fatalf("after a new term: %d resyncs, epoch %q; want 1, l/2", st.Resyncs, f.store.Epoch())
	}

	// Restarted after the leader's log moved on without it: a snapshot.
	f.stop()
	for i := range replica.MaxLog + 10 {
		mustNil(t, l.store.Apply(slices_, replica.Modified, slice("ns", "new", uint64(41+i))))
	}
	f.start()
	converged(t, l, f)
	if st := f.follower.Status(); st.Resyncs != 1 {
		t.Fatalf("after a restart behind the log: %d resyncs, want 1", st.Resyncs)
	}
}

func TestLeaderChangeFollowsNewLeader(t *testing.T) {
	c := newCluster(t)
	a, b, f := c.addNode("a", "p"), c.addNode("b", "p"), c.addNode("f", "p")
	a.lead("a/1")
	mustNil(t, a.store.Replace(slices_, []json.RawMessage{slice("ns", "x", 5)}, 10))
	converged(t, a, b, f)

	// b takes over from its replica, starting a term.
	b.lead("b/1")
	mustNil(t, b.store.Apply(slices_, replica.Added, slice("ns", "y", 11)))
	converged(t, b, a, f)
	if st := f.follower.Status(); st.Leader != "b" {
		t.Fatalf("follower streams from %q, want b", st.Leader)
	}
}

// A follower that does not read ends up behind the leader's log; the
// leader ends its stream rather than buffer for it.
func TestSlowFollowerStreamEnds(t *testing.T) {
	c := newCluster(t)
	l := c.addNode("l", "a")
	l.lead("l/1")
	mustNil(t, l.store.Replace(slices_, nil, 1))
	cl := c.client("slow", "a", c.nodeCert("slow"), c.ca.Pool())
	cl.tr.HTTP2.MaxReceiveBufferPerStream = 64 << 10 // the leader blocks soon

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := cl.replicate(ctx, "l", "", 0)
	mustNil(t, err)
	defer resp.Body.Close()
	r := newFrameReader(resp.Body)
	if fr, _, err := r.next(); err != nil || fr.Type != frameTrust {
		t.Fatalf("first frame %+v, %v; want the gateway chains", fr, err)
	}
	if fr, _, err := r.next(); err != nil || fr.Type != frameSnapshot {
		t.Fatalf("first frame %+v, %v; want a snapshot", fr, err)
	}

	// Not reading, while the log moves on by more than it holds.
	for i := range 2 * replica.MaxLog {
		mustNil(t, l.store.Apply(slices_, replica.Modified, slice("ns", "s", uint64(i+2))))
	}
	var last uint64
	for {
		fr, _, err := r.next()
		if errors.Is(err, io.EOF) {
			break
		}
		mustNil(t, err)
		if fr.Type == frameChanges {
			last = fr.Items[len(fr.Items)-1].Rev
		}
	}
	if last >= l.store.Rev() {
		t.Fatalf("the stream reached the leader's revision %d; it should have ended behind", last)
	}
	if n := value(l.server.m.ended.WithLabelValues(endedBehind)); n != 1 {
		t.Fatalf("streams ended behind: %v, want 1", n)
	}
}

func TestBatches(t *testing.T) {
	many := make([]replica.Change, 2*frameMaxItems+frameMaxItems/2)
	big := []replica.Change{{Object: make(json.RawMessage, frameTargetBytes)}, {Object: make(json.RawMessage, 10)}, {Object: make(json.RawMessage, frameTargetBytes)}}
	for _, tc := range []struct {
		name  string
		items []replica.Change
		want  []int
	}{
		{"none", nil, nil},
		{"by count", many, []int{frameMaxItems, frameMaxItems, frameMaxItems / 2}},
		{"by size, a big object alone", big, []int{1, 1, 1}},
	} {
		var got []int
		for _, b := range batches(tc.items) {
			got = append(got, len(b))
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: batches of %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Everything a cluster started is gone once its nodes stopped.
func TestNoGoroutineLeft(t *testing.T) {
	t.Run("cluster", func(t *testing.T) {
		c := newCluster(t)
		l, f := c.addNode("l", "a"), c.addNode("f", "a")
		l.lead("l/1")
		mustNil(t, l.store.Replace(slices_, []json.RawMessage{slice("ns", "a", 5)}, 10))
		converged(t, l, f)
		mustNil(t, f.follower.DelegateToLeader(context.Background(), leaseOf(t, "f", "kube-node-lease")))
	})
	ours := regexp.MustCompile(`poolstore\.\(\*(Server|Follower|Client|stream)\)`)
	testenv.EventuallyNoError(t, "the pool's goroutines to end", func() error {
		stacks := make([]byte, 1<<20)
		stacks = stacks[:runtime.Stack(stacks, true)]
		if ours.Match(stacks) {
			return fmt.Errorf("goroutines left:\n%s", stacks)
		}
		return nil
	})
}
