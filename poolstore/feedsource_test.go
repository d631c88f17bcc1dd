package poolstore

import (
	"context"
	"crypto"
	"testing"
	"time"

	"github.com/tether-edge/tether/gateway/poolfeed"
	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestFeedSourceToFollowers: a leader fills its store from a gateway's
// signed feed (gateway/poolfeed, list/watching a real kube-apiserver) and
// its followers verify and commit all of it: the same content, synced
// at the gateway's marks, changes included.
func TestFeedSourceToFollowers(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createSlices(t, ctx, cp.Client, 0, 20)
	admin, err := kube.NewForConfig(cp.Admin)
	mustNil(t, err)

	c := newCluster(t)
	fd, err := poolfeed.New(poolfeed.Options{Client: admin, Name: "gw-test", MarkEvery: 200 * time.Millisecond,
		Signer: func() (crypto.Signer, [][]byte, error) {
			return c.gw.kp.TLS.PrivateKey.(crypto.Signer), c.gw.kp.TLS.Certificate, nil
		}})
	mustNil(t, err)
	go fd.Run(ctx)

	l, f1, f2 := c.addNode("l", "a"), c.addNode("f1", "a"), c.addNode("f2", "a")
	l.lead("l/1")
	go NewFeedSource(FeedSourceOptions{Store: l.store, Verifier: c.verifier(), Open: servePipe(fd)}).Run(ctx)

	same := func(what string) {
		for _, f := range []*node{f1, f2} {
			testenv.Eventually(t, f.name+": "+what, func() bool {
				return countSlices(l.store) > 0 && f.store.Digest() == l.store.Digest() && f.store.Rev() == l.store.Rev()
			})
		}
	}
	same("the leader's content, from the gateway's feed")
	if n := countSlices(f1.store); n != 20 {
		t.Fatalf("f1 has %d slices, want 20", n)
	}
	for _, f := range []*node{f1, f2} {
		testenv.Eventually(t, f.name+" synced from a gateway mark", func() bool { return !f.store.SyncedAt().IsZero() })
	}
	createSlices(t, ctx, cp.Client, 20, 25)
	testenv.Eventually(t, "the leader has the new slices", func() bool { return countSlices(l.store) == 25 })
	same("the new slices")
	for _, f := range []*node{f1, f2} {
		for _, reason := range leaderRefusalReasons {
			if n := value(f.follower.m.refused.WithLabelValues(reason)); n != 0 {
				t.Errorf("%s refused its leader %v times (%s)", f.name, n, reason)
			}
		}
	}
}
