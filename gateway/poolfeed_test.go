package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/gateway/internal/pooltest"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/tunnel"
)

// TestPoolFeedThroughTunnel: a pool's leader gets the pool feed through
// its tunnel, signed by the certificate the tunnel listener serves and
// verifiable with what the edge verifies the gateway with; a follower is
// refused not_leader.
func TestPoolFeedThroughTunnel(t *testing.T) {
	pc := pooltest.Start(t, pooltest.Options{Manifests: []string{"edge-rbac.yaml", "pool-rbac.yaml"},
		Pools: map[string]string{"edge-1": "pool-a", "edge-2": "pool-a"}, Labels: map[string]string{nodewatch.EdgeLabel: "true"}})
	ctx := pc.Ctx
	cfg, ca := testConfig(t, pc.Kubeconfig(t, "tether-gateway", pc.GatewayCert))
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopGateway := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(runCtx) }()
	defer func() {
		stopGateway()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	testenv.Eventually(t, "/readyz answers ok", func() bool { return httpGet(t, "http://"+g.AdminAddr().String()+"/readyz") == "ok\n" })
	pc.Elect("pool-a", "edge-1")
	leader, follower := startTunnel(t, ctx, g, ca, "edge-1"), startTunnel(t, ctx, g, ca, "edge-2")

	_, err = follower.PoolFeed(ctx, "pool-a")
	var re *edgetunnel.PoolFeedRefusedError
	if !errors.As(err, &re) || re.Code != tunnel.NotLeader {
		t.Fatalf("the follower's pool feed: %v, want a not_leader refusal", err)
	}

	var rc interface{ Close() error }
	covered := make(chan struct{})
	testenv.EventuallyNoError(t, "the leader's pool feed", func() error {
		s, err := leader.PoolFeed(ctx, "pool-a")
		if err == nil {
			rc = s
			go readFeed(t, s, leader, covered)
		}
		return err
	})
	defer rc.Close()
	select {
	case <-covered:
	case <-time.After(30 * time.Second):
		t.Fatal("no verified mark covering the three resources")
	}
}

// readFeed reads the feed, verifies every statement with what the edge
// knows of the gateways, until the first mark covering
// the three resources, after their whole units: closes covered then.
func readFeed(t *testing.T, s interface{ Read([]byte) (int, error) }, c *edgetunnel.Client, covered chan<- struct{}) {
	v, err := feed.NewVerifier(feed.VerifierOptions{Roots: c.RootCAs(), Names: c.GatewayNames()})
	if err != nil {
		t.Error(err)
		return
	}
	rd := feed.NewReader(s)
	whole := map[string]bool{}
	for {
		fr, _, err := rd.Next()
		if err != nil {
			return
		}
		switch fr.Type {
		case feed.FrameCerts:
			if err := v.AddChain(fr.Chain); err != nil {
				t.Errorf("chain: %v", err)
			}
		case feed.FrameUnit:
			if fr.Replace {
				whole[fr.Resource] = true
			}
			if !fr.Attest.IsZero() {
				if _, err := v.Open(fr.Attest); err != nil {
					t.Errorf("attestation of %s: %v", fr.Resource, err)
				}
			}
		case feed.FrameMark:
			h, err := v.Open(fr.Mark)
			if err != nil {
				t.Errorf("mark: %v", err)
				continue
			}
			if len(h.Resources) == 3 && len(whole) == 3 {
				close(covered)
				return
			}
		}
	}
}
