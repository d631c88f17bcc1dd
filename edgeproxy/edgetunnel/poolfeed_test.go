package edgetunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// servePoolFeeds answers the pool feed streams an edge opens on conn with
// answer's reply; after an OK one it writes a frame line and waits until
// the edge stops reading, then sends on ended.
func servePoolFeeds(t *testing.T, conn *quic.Conn, answer func(tunnel.PoolFeedRequest) tunnel.Reply, ended chan<- struct{}) {
	t.Helper()
	go func() {
		for {
			s, err := conn.AcceptStream(context.Background())
			if err != nil {
				return
			}
			go func() {
				req, err := tunnel.ReadPoolFeedRequest(s)
				if err != nil {
					t.Errorf("gateway reads request: %v", err)
					s.CancelRead(0)
					s.CancelWrite(0)
					return
				}
				rep := answer(req)
				tunnel.WriteReply(s, rep)
				if rep.Code != tunnel.OK {
					s.Close()
					return
				}
				s.Write([]byte("frame\n"))
				<-s.Context().Done() // the edge stopped reading
				ended <- struct{}{}
			}()
		}
	}()
}

func TestPoolFeed(t *testing.T) {
	_, gw, e, _ := setup(t, Options{})
	var mu sync.Mutex
	reply := tunnel.Reply{Code: tunnel.NotLeader, Message: "pool shop is led by edge-2"}
	ended := make(chan struct{}, 1)
	serveReqs := make(chan string, 4)
	servePoolFeeds(t, gw.nextConn(), func(req tunnel.PoolFeedRequest) tunnel.Reply {
		serveReqs <- req.Pool
		mu.Lock()
		defer mu.Unlock()
		return reply
	}, ended)
	testenv.Eventually(t, "connected", func() bool { return e.Ready() == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, err := e.PoolFeed(ctx, "shop")
	var re *PoolFeedRefusedError
	if !errors.As(err, &re) || re.Code != tunnel.NotLeader || re.Pool != "shop" || re.Gateway != gw.addr.String() ||
		re.Message != "pool shop is led by edge-2" {
		t.Fatalf("PoolFeed: %v; want a *PoolFeedRefusedError not_leader from %s", err, gw.addr)
	}
	if pool := <-serveReqs; pool != "shop" {
		t.Errorf("gateway got pool %q", pool)
	}

	mu.Lock()
	reply = tunnel.Reply{Code: tunnel.OK}
	mu.Unlock()
	rc, err := e.PoolFeed(ctx, "shop")
	if err != nil {
		t.Fatalf("PoolFeed: %v", err)
	}
	<-serveReqs
	if line, err := bufio.NewReader(rc).ReadString('\n'); line != "frame\n" || err != nil {
		t.Fatalf("feed: %q, %v", line, err)
	}
	rc.Close()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway did not see the edge end the feed")
	}

	if _, err := e.PoolFeed(ctx, "a/b"); !errors.Is(err, tunnel.ErrBadHeader) {
		t.Errorf("bad pool: %v, want ErrBadHeader", err)
	}
}

func TestGatewayNames(t *testing.T) {
	c, err := New(Options{Gateways: []string{"gw.example:1", "gw.example:2", "10.0.0.1"}, AllowPorts: []uint16{1},
		Certificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.GatewayNames(); !slices.Equal(got, []string{"gw.example", "10.0.0.1"}) {
		t.Errorf("GatewayNames = %q", got)
	}
	c, err = New(Options{Gateways: []string{"10.0.0.1"}, ServerName: "gateway.tether", AllowPorts: []uint16{1},
		Certificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.GatewayNames(); !slices.Equal(got, []string{"gateway.tether"}) {
		t.Errorf("GatewayNames with ServerName = %q", got)
	}
}
