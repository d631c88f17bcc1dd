package tunnel

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

var (
	benchBulk  = flag.Int64("window.bulk", 32<<20, "bytes of each BenchmarkBulkWindow transfer")
	benchEdges = flag.Int("window.edges", 200, "edges of BenchmarkStalledReceivers/stalled")
	benchGrown = flag.Int("window.grown-edges", 20, "edges of BenchmarkStalledReceivers/grown")
)

// windowConfig is QUICConfig with the stream window capped at w and the
// connection's at 1.5 w (quic-go grows a connection's window to 1.5
// times its largest stream window, so that one stream is never held
// back by its connection).
func windowConfig(w uint64) *quic.Config {
	c := QUICConfig(Limits{})
	c.MaxStreamReceiveWindow = w
	c.MaxConnectionReceiveWindow = w * 3 / 2
	c.InitialStreamReceiveWindow = min(c.InitialStreamReceiveWindow, w)
	c.InitialConnectionReceiveWindow = min(c.InitialConnectionReceiveWindow, c.MaxConnectionReceiveWindow)
	return c
}

// BenchmarkBulkWindow is bulk throughput against the maximum receive
// window: one stream per iteration, opened by the gateway side, on which
// the edge side sends -window.bulk bytes (as a kubelet answers kubectl
// logs or cp through the tunnel), over loopback UDP and over a path of
// 80 ms round trip (a delay line in this process, see delayConn; it has
// no rate limit, so the machine's CPU is the other bound). A new stream
// starts at the initial window and auto-tuning grows it, so short
// transfers see less than the maximum.
//
//	go test -run '^$' -bench BulkWindow -benchtime 3x ./tunnel/
func BenchmarkBulkWindow(b *testing.B) {
	for _, rtt := range []time.Duration{0, 80 * time.Millisecond} {
		for _, mib := range []uint64{1, 2, 4, 8, 16} {
			b.Run(fmt.Sprintf("rtt=%s/window=%dMiB", rtt, mib), func(b *testing.B) {
				cfg := windowConfig(mib << 20)
				ends := listenEnds(b, rtt, cfg, cfg)
				gw, edge := ends.dial()
				n := *benchBulk
				b.SetBytes(n)
				lost0, dropped0 := edge.ConnectionStats().PacketsLost, delayLost.Load()
				b.ResetTimer()
				for range b.N {
					if err := bulk(gw, edge, n); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				// What the path was like: on a busy machine the delay line
				// runs late, so round trips grow beyond rtt and packets
				// are lost in bursts.
				st := edge.ConnectionStats()
				b.ReportMetric(float64(st.SmoothedRTT)/float64(time.Millisecond), "srtt-ms")
				b.ReportMetric(float64(st.PacketsLost-lost0)/float64(b.N), "lost/op")
				b.ReportMetric(float64(delayLost.Load()-dropped0)/float64(b.N), "dropped/op")
			})
		}
	}
}

// bulk moves n bytes from edge to gw on a stream gw opens.
func bulk(gw, edge *quic.Conn, n int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sent := make(chan error, 1)
	go func() {
		s, err := edge.AcceptStream(ctx)
		if err != nil {
			sent <- err
			return
		}
		var req [1]byte
		if _, err := io.ReadFull(s, req[:]); err != nil {
			sent <- err
			return
		}
		buf := make([]byte, 64<<10)
		for left := n; left > 0; {
			k, err := s.Write(buf[:min(left, int64(len(buf)))])
			if err != nil {
				sent <- err
				return
			}
			left -= int64(k)
		}
		sent <- s.Close()
	}()
	s, err := gw.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	defer s.CancelRead(0)
	if _, err := s.Write([]byte{1}); err != nil {
		return err
	}
	s.Close()
	got, err := io.Copy(io.Discard, s)
	if err != nil {
		return fmt.Errorf("after %d bytes: %w", got, err)
	}
	if err := <-sent; err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if got != n {
		return fmt.Errorf("%d bytes, want %d", got, n)
	}
	return nil
}

// oldConfig is the configuration before the windows were chosen by
// BenchmarkBulkWindow: 1 MiB growing to 16 MiB per stream, 4 MiB
// growing to 64 MiB per connection, no budget.
func oldConfig() *quic.Config {
	c := QUICConfig(Limits{})
	c.InitialStreamReceiveWindow, c.MaxStreamReceiveWindow = 1<<20, 16<<20
	c.InitialConnectionReceiveWindow, c.MaxConnectionReceiveWindow = 4<<20, 64<<20
	return c
}

// grownConfig is c with its windows where auto-tuning leaves them at
// most: a stream's at its maximum, the connection's at 1.5 times that
// (what quic-go grows it to for one stream).
func grownConfig(c *quic.Config) *quic.Config {
	c.InitialStreamReceiveWindow = c.MaxStreamReceiveWindow
	c.InitialConnectionReceiveWindow = min(c.MaxStreamReceiveWindow*3/2, c.MaxConnectionReceiveWindow)
	return c
}

// BenchmarkStalledReceivers measures what slow readers cost the gateway
// side: edges over loopback, each with one stream the gateway opened
// and never reads (a cloud client that reads nothing), whose sender
// fills all the window it is given. Both sides run in this process; the
// figures are the growth of the Go heap (live bytes after a GC) and of
// the process's RSS from before the streams opened, and what the senders
// got out (unread by the gateway side), per edge.
//
//   - stalled: -window.edges edges whose streams start at the initial
//     windows, as a stream does.
//   - grown: -window.grown-edges edges whose windows start where
//     auto-tuning leaves them at most (grownConfig): the worst case of
//     one stream per edge, a stream that was read fast and then not at
//     all. A ReceiveBudget bounds how many tunnels get there together;
//     TestReceiveBudget tests that bound.
//
// before is the configuration before this benchmark (oldConfig), after
// is QUICConfig's.
//
//	go test -run '^$' -bench StalledReceivers -benchtime 1x ./tunnel/
func BenchmarkStalledReceivers(b *testing.B) {
	for _, sc := range []struct {
		name  string
		edges int
		conf  func(*quic.Config) *quic.Config
	}{
		{"stalled", *benchEdges, func(c *quic.Config) *quic.Config { return c }},
		{"grown", *benchGrown, grownConfig},
	} {
		for _, cf := range []struct {
			name string
			conf func() *quic.Config
		}{
			{"before", oldConfig},
			{"after", func() *quic.Config { return QUICConfig(Limits{}) }},
		} {
			b.Run(fmt.Sprintf("%s/%s/edges=%d", sc.name, cf.name, sc.edges), func(b *testing.B) {
				for range b.N {
					stalledReceivers(b, sc.edges, sc.conf(cf.conf()), cf.conf())
				}
			})
		}
	}
}

func stalledReceivers(b *testing.B, edges int, gwCfg, edgeCfg *quic.Config) {
	ends := listenEnds(b, 0, gwCfg, edgeCfg)
	gws := make([]*quic.Conn, edges)
	var sent atomic.Int64
	for i := range gws {
		var edge *quic.Conn
		gws[i], edge = ends.dial()
		go sendForever(edge, &sent)
	}
	heap0, rss0 := memory()
	for _, gw := range gws {
		openStream(b, gw)
	}
	if !settle(&sent) {
		b.Fatalf("senders did not stall within 5 minutes: %d bytes sent", sent.Load())
	}
	heap1, rss1 := memory()
	mib := func(v int64) float64 { return float64(v) / (1 << 20) }
	b.ReportMetric(mib(heap1-heap0)/float64(edges), "heap-MiB/edge")
	b.ReportMetric(mib(rss1-rss0), "rss-MiB")
	b.ReportMetric(mib(sent.Load())/float64(edges), "unread-MiB/edge")
	for _, gw := range gws {
		gw.CloseWithError(CloseNormal, "")
	}
}

// settle waits until the senders have stopped: the bytes sent did not
// change for a second.
func settle(sent *atomic.Int64) bool {
	last, still := int64(-1), 0
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if n := sent.Load(); n != last {
			last, still = n, 0
			continue
		}
		if still++; still == 10 {
			return true
		}
	}
	return false
}

// memory returns the live heap after a GC and the process's RSS, after
// returning what memory it can to the system.
func memory() (heap, rss int64) {
	runtime.GC()
	debug.FreeOSMemory() // so that RSS follows the heap down as well as up
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc), vmRSS()
}

// vmRSS reads VmRSS from /proc/self/status; 0 if it cannot.
func vmRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
