package tunnel

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/internal/testenv"
)

// delayConn is a UDP socket whose every datagram leaves d after it was
// written: a path of one-way delay d, in this process and without root.
// It embeds *net.UDPConn so that quic-go uses it as it uses a real socket
// (GSO batches included), and holds back WriteMsgUDP and WriteTo; the
// reads are the socket's. Datagrams leave in the order they were written;
// when more than delayQueue wait, the newest are dropped, as a router's
// full queue drops them.
type delayConn struct {
	*net.UDPConn
	d     time.Duration
	queue chan delayed
	done  chan struct{}
	once  sync.Once
}

const delayQueue = 1 << 16

// delaySlack is how early a delayed datagram may leave.
const delaySlack = time.Millisecond

// delayLost counts the writes the delay lines dropped (queue full) or
// failed to send.
var delayLost atomic.Int64

type delayed struct {
	due     time.Time
	b, oob  []byte
	addr    *net.UDPAddr
	isMsgTo bool
}

func newDelayConn(c *net.UDPConn, d time.Duration) *delayConn {
	dc := &delayConn{UDPConn: c, d: d, queue: make(chan delayed, delayQueue), done: make(chan struct{})}
	go dc.run()
	return dc
}

func (c *delayConn) run() {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		var p delayed
		select {
		case p = <-c.queue:
		case <-c.done:
			return
		}
		// Packets due within delaySlack go out together: a timer per
		// packet would cap the line at the rate the scheduler wakes a
		// goroutine up, far below what loopback carries.
		if wait := time.Until(p.due) - delaySlack; wait > 0 {
			t.Reset(wait)
			select {
			case <-t.C:
			case <-c.done:
				return
			}
		}
		var err error
		if p.isMsgTo {
			_, _, err = c.UDPConn.WriteMsgUDP(p.b, p.oob, p.addr)
		} else {
			_, err = c.UDPConn.WriteTo(p.b, p.addr)
		}
		if err != nil {
			delayLost.Add(1)
		}
	}
}

func (c *delayConn) push(p delayed) {
	p.due = time.Now().Add(c.d)
	select {
	case c.queue <- p:
	default: // queue full: dropped
		delayLost.Add(1)
	}
}

func (c *delayConn) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (int, int, error) {
	c.push(delayed{b: append([]byte(nil), b...), oob: append([]byte(nil), oob...), addr: addr, isMsgTo: true})
	return len(b), len(oob), nil
}

func (c *delayConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	ua, ok := addr.(*net.UDPAddr)
	if !ok {
		return 0, fmt.Errorf("delayConn: address %v is not UDP", addr)
	}
	c.push(delayed{b: append([]byte(nil), b...), addr: ua})
	return len(b), nil
}

func (c *delayConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return c.UDPConn.Close()
}

// quicEnds is one gateway-side listener and the edges that dialled it,
// each from a socket of its own, over loopback UDP whose one-way delay
// is rtt/2 in each direction.
type quicEnds struct {
	tb     testing.TB
	ln     *quic.Listener
	addr   net.Addr
	rtt    time.Duration
	cliTLS *tls.Config
	cliCfg *quic.Config
}

// listenEnds starts the gateway side with gwCfg; edges dial with edgeCfg.
func listenEnds(tb testing.TB, rtt time.Duration, gwCfg, edgeCfg *quic.Config) *quicEnds {
	tb.Helper()
	ca := testenv.MustCA(tb, "tunnel-window-ca")
	srv, err := ca.ServerCert("gateway", "127.0.0.1")
	if err != nil {
		tb.Fatal(err)
	}
	node, err := ca.NodeCert("edge-1")
	if err != nil {
		tb.Fatal(err)
	}
	pc := udpSocket(tb, rtt)
	tr := &quic.Transport{Conn: pc}
	tb.Cleanup(func() { tr.Close() })
	ln, err := tr.Listen(ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &srv.TLS, nil }, ca.Pool()), gwCfg)
	if err != nil {
		tb.Fatal(err)
	}
	return &quicEnds{tb: tb, ln: ln, addr: pc.LocalAddr(), rtt: rtt, cliCfg: edgeCfg,
		cliTLS: ClientTLS(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &node.TLS, nil }, ca.Pool(), "127.0.0.1")}
}

// udpSocket is a loopback UDP socket, delayed by rtt/2 when rtt > 0.
func udpSocket(tb testing.TB, rtt time.Duration) net.PacketConn {
	tb.Helper()
	uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatal(err)
	}
	if rtt <= 0 {
		return uc
	}
	return newDelayConn(uc, rtt/2)
}

// dial connects one more edge and returns both ends of its connection.
func (e *quicEnds) dial() (gw, edge *quic.Conn) {
	e.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	accepted := make(chan *quic.Conn, 1)
	go func() {
		c, _ := e.ln.Accept(ctx)
		accepted <- c
	}()
	tr := &quic.Transport{Conn: udpSocket(e.tb, e.rtt)}
	e.tb.Cleanup(func() { tr.Close() })
	edge, err := tr.Dial(ctx, e.addr, e.cliTLS, e.cliCfg)
	if err != nil {
		e.tb.Fatal(err)
	}
	if gw = <-accepted; gw == nil {
		e.tb.Fatal("no connection accepted")
	}
	e.tb.Cleanup(func() {
		edge.CloseWithError(CloseNormal, "")
		gw.CloseWithError(CloseNormal, "")
	})
	return gw, edge
}

// sendForever accepts the stream the gateway opens on edge, reads its
// one-byte request and writes to it until the stream or connection
// ends, adding every byte written to *sent.
func sendForever(edge *quic.Conn, sent *atomic.Int64) {
	s, err := edge.AcceptStream(context.Background())
	if err != nil {
		return
	}
	var req [1]byte
	if _, err := io.ReadFull(s, req[:]); err != nil {
		return
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := s.Write(buf)
		sent.Add(int64(n))
		if err != nil {
			return
		}
	}
}

// openStream opens a stream from gw and sends the one-byte request that
// starts the edge's sender.
func openStream(tb testing.TB, gw *quic.Conn) *quic.Stream {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := gw.OpenStreamSync(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := s.Write([]byte{1}); err != nil {
		tb.Fatal(err)
	}
	return s
}

// TestReceiveBudget checks the gateway-wide bound: edges whose streams
// the gateway reads fast over an 80 ms path, so that auto-tuning asks to
// grow their connection windows, get no more growth together than the
// budget; what they got is given back when they close; and the
// transfers go on after a refusal.
func TestReceiveBudget(t *testing.T) {
	const budget = 3 << 20
	b := NewReceiveBudget(budget)
	gwCfg := QUICConfig(Limits{ReceiveBudget: b})
	ends := listenEnds(t, 80*time.Millisecond, gwCfg, QUICConfig(Limits{}))

	const edges = 3
	var sent atomic.Int64
	var wg sync.WaitGroup
	gws := make([]*quic.Conn, edges)
	for i := range gws {
		gw, edge := ends.dial()
		gws[i] = gw
		go sendForever(edge, &sent)
		s := openStream(t, gw)
		wg.Add(1)
		go func() {
			defer wg.Done()
			io.Copy(io.Discard, s)
		}()
	}
	// Auto-tuning grows a window by doubling it, so 3 edges reading fast
	// ask for more than 3 MiB soon; the budget refuses some.
	testenv.Never(t, "more bytes granted than the budget",
		func() bool { return b.Used() > budget },
		func() bool { return b.Refused() > 0 })
	if used := b.Used(); used > budget || used == 0 {
		t.Fatalf("granted %d bytes, want some and at most %d", used, budget)
	}
	// A refused connection still moves data.
	before := sent.Load()
	testenv.Eventually(t, "4 MiB moved after the budget was spent", func() bool { return sent.Load()-before >= 4<<20 })
	for _, gw := range gws {
		gw.CloseWithError(CloseNormal, "")
	}
	wg.Wait()
	testenv.Eventually(t, "every grant returned after every connection closed", func() bool { return b.Used() == 0 })
}
