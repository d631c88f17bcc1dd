package poolfeed

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/gateway/poolcheck"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// TestHandler: only the pool's leader gets the feed, and it loses it
// when it no longer leads; every other sender is refused with the
// check's code before a byte of the feed.
func TestHandler(t *testing.T) {
	e := startFeed(t, Options{}, nil)
	stop := e.Elect("shop", "edge-1")
	gw := e.Gateway
	h := NewHandler(e.feed, HandlerOptions{
		Check:         poolcheck.Checker{Nodes: poolcheck.APINodes{Client: gw}, Records: gw.CoreV1().ConfigMaps(record.Namespace)},
		LeaderRecheck: 100 * time.Millisecond,
	})
	for _, c := range []struct {
		sender, pool string
		want         tunnel.Code
	}{
		{"edge-2", "shop", tunnel.NotLeader},
		{"loner", "shop", tunnel.NotInPool},
		{"yard-1", "shop", tunnel.OtherPool},
		{"ghost", "shop", tunnel.UnknownNode},
		{"edge-1", "yard", tunnel.OtherPool},
	} {
		var replies []tunnel.Reply
		var w bytes.Buffer
		err := h.ServePoolFeed(e.Ctx, c.sender, tunnel.PoolFeedRequest{Pool: c.pool}, &w, func(r tunnel.Reply) error {
			replies = append(replies, r)
			return nil
		})
		if err != nil || len(replies) != 1 || replies[0].Code != c.want || w.Len() != 0 {
			t.Errorf("%s for pool %s: %v, replies %+v, %d bytes of feed; want one %s reply and no feed", c.sender, c.pool, err, replies, w.Len(), c.want)
		}
	}
	if n, _ := metrictest.Value(e.feed.refusals, "tether_gateway_pool_feed_refusals_total", "code=not_leader"); n != 1 {
		t.Errorf("%v not_leader refusals counted, want 1", n)
	}

	// The leader is served until it no longer leads.
	pr, pw := io.Pipe()
	defer pr.Close()
	done := make(chan error, 1)
	var replies []tunnel.Reply
	go func() {
		err := h.ServePoolFeed(e.Ctx, "edge-1", tunnel.PoolFeedRequest{Pool: "shop"}, pw, func(r tunnel.Reply) error {
			replies = append(replies, r)
			return nil
		})
		pw.CloseWithError(err)
		done <- err
	}()
	rd := feed.NewReader(pr)
	if fr, _, err := rd.Next(); err != nil || fr.Type != feed.FrameCerts {
		t.Fatalf("first frame: %+v, %v; want certs", fr, err)
	}
	go io.Copy(io.Discard, pr)
	stop() // releases the record
	var err error
	testenv.Eventually(t, "the feed ends once edge-1 no longer leads", func() bool {
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	})
	if !errors.Is(err, errLeadLost) || len(replies) != 1 || replies[0].Code != tunnel.OK {
		t.Errorf("leader's feed: %v, replies %+v; want one OK and the lead lost", err, replies)
	}
	if n, _ := metrictest.Value(e.feed.ended, "tether_gateway_pool_feed_ended_total", "reason=not_leader"); n != 1 {
		t.Errorf("%v feeds ended for not_leader, want 1", n)
	}
}
