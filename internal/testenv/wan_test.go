package testenv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestLinkValidate(t *testing.T) {
	t.Parallel()
	for _, l := range []Link{
		{Delay: -time.Millisecond},
		{Jitter: -time.Millisecond},
		{Delay: time.Minute},
		{Loss: -0.1},
		{Loss: 1.5},
		{Loss: math.NaN()},
		{Rate: -1},
		{Rate: 100},
	} {
		if err := l.Validate(); err == nil {
			t.Errorf("%+v accepted", l)
		}
	}
	for _, l := range []Link{{}, {Delay: 40 * time.Millisecond, Jitter: 50 * time.Millisecond, Loss: 1, Rate: 20e6}} {
		if err := l.Validate(); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
	}
	if got, want := (Link{Delay: 40 * time.Millisecond, Loss: 0.03, Rate: 20e6}).String(), "delay=40ms loss=3% rate=20Mbit/s"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// TestShape checks, with probes of its own, that a shaped uplink delays,
// jitters, loses and limits as asked, that it can be reshaped while
// traffic flows, and that the zero Link restores it. The bounds only
// assume that a busy machine is slower, never faster.
func TestShape(t *testing.T) {
	RequireRoot(t)
	CheckLeaks(t)
	topo := NewTopology(t, TopologySpec{
		CloudHosts: []string{"gw"},
		Sites:      []SiteSpec{{Name: "far", Hosts: []string{"e1"}}},
	})
	site := topo.Site("far")
	gw, e1 := topo.Cloud("gw"), site.Host("e1")
	echo := startUDPEcho(t, gw)
	shape := func(l Link) {
		t.Helper()
		if err := site.Shape(l); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("Delay", func(t *testing.T) {
		const delay = 40 * time.Millisecond
		shape(Link{Delay: delay})
		before := site.WANStats()
		r := runProbes(t, e1, echo, 50, 10*time.Millisecond, 2*time.Second)
		t.Logf("delay %v: %v", delay, r)
		if r.received != r.sent {
			t.Errorf("%d of %d probes lost", r.sent-r.received, r.sent)
		}
		// Every packet waits at least the delay in each direction.
		if r.min() < 2*delay || r.median() > 2*delay+time.Second {
			t.Errorf("round trips %v; want all at least %v and a median not far above", r, 2*delay)
		}
		// The counters move just after each write back into the TUN
		// device, which may deliver the packet first.
		var st WANStats
		Eventually(t, fmt.Sprintf("the delay line to count %d packets up and %d down", r.sent, r.received), func() bool {
			st = site.WANStats()
			return st.Up.Packets-before.Up.Packets >= uint64(r.sent) && st.Down.Packets-before.Down.Packets >= uint64(r.received)
		})
		if st.Up.Dropped+st.Down.Dropped != 0 {
			t.Errorf("delay line dropped packets: %+v", st)
		}
		// Super-packets cross the line whole and arrive intact: TCP
		// (TSO) and UDP (GSO, as quic-go sends).
		for _, download := range []bool{false, true} {
			if _, err := bulk(gw, e1, 2<<20, download, nil); err != nil {
				t.Errorf("TCP through the delay line (download %v): %v", download, err)
			}
		}
		udpGSO(t, gw, e1)
	})

	t.Run("Jitter", func(t *testing.T) {
		const delay, jitter = 20 * time.Millisecond, 10 * time.Millisecond
		shape(Link{Delay: delay, Jitter: jitter})
		// Probes spaced by more than 2*jitter do not wait for each other:
		// their round trips spread over 2*(delay±jitter).
		sparse := runProbes(t, e1, echo, 40, 25*time.Millisecond, 2*time.Second)
		t.Logf("delay %v jitter %v, sparse: %v", delay, jitter, sparse)
		if sparse.received != sparse.sent {
			t.Errorf("%d of %d probes lost", sparse.sent-sparse.received, sparse.sent)
		}
		if lo, spread := sparse.min(), sparse.max()-sparse.min(); lo < 2*(delay-jitter) || spread < jitter {
			t.Errorf("round trips %v; want all at least %v, spread over at least %v", sparse, 2*(delay-jitter), jitter)
		}
		// Dense probes would overtake each other if the line reordered.
		dense := runProbes(t, e1, echo, 200, time.Millisecond, 2*time.Second)
		t.Logf("delay %v jitter %v, dense: %v", delay, jitter, dense)
		if dense.reordered != 0 || dense.received != dense.sent {
			t.Errorf("dense probes: %d of %d came back, %d out of order", dense.received, dense.sent, dense.reordered)
		}
	})

	t.Run("Loss", func(t *testing.T) {
		const loss, n = 0.2, 2000
		shape(Link{Loss: loss})
		got := echo.got.Load()
		r := runProbes(t, e1, echo, n, 500*time.Microsecond, time.Second)
		atServer := int(echo.got.Load() - got)
		// Each direction drops on its own: the server counts what the way
		// up let through, the client what also came back.
		upLoss := 1 - float64(atServer)/float64(r.sent)
		downLoss := 1 - float64(r.received)/float64(max(atServer, 1))
		t.Logf("loss %v: %d probes, %d reached the server, %d came back: up %.3f, down %.3f",
			loss, r.sent, atServer, r.received, upLoss, downLoss)
		// ±0.08 is about 9 standard deviations for 2,000 draws.
		for _, l := range []float64{upLoss, downLoss} {
			if l < loss-0.08 || l > loss+0.08 {
				t.Errorf("measured loss up %.3f, down %.3f; want %v±0.08 each", upLoss, downLoss, loss)
				break
			}
		}
	})

	t.Run("Rate", func(t *testing.T) {
		const rate, size = 8_000_000, 1_500_000
		shape(Link{Rate: rate})
		// Both directions at once: each has its own limit.
		type result struct {
			bps float64
			err error
		}
		results := make(chan result, 2)
		for _, download := range []bool{false, true} {
			go func() {
				bps, err := bulk(gw, e1, size, download, nil)
				results <- result{bps, err}
			}()
		}
		for range 2 {
			r := <-results
			if r.err != nil {
				t.Fatal(r.err)
			}
			t.Logf("rate %d bit/s: TCP moved %.0f bit/s (%.2f of the rate)", rate, r.bps, r.bps/rate)
			// TCP payload is 96% of a full frame; the machine being busy
			// only makes it slower.
			if r.bps > 1.2*rate || r.bps < 0.3*rate {
				t.Errorf("TCP moved %.0f bit/s through a %d bit/s link; want 0.3 to 1.2 of it", r.bps, rate)
			}
		}
	})

	t.Run("ReshapeUnderLoad", func(t *testing.T) {
		const size = 4 << 20
		shape(Link{Delay: 10 * time.Millisecond, Rate: 20e6})
		before := site.WANStats()
		step := 0
		var shapeErr error
		_, err := bulk(gw, e1, size, true, func(got int) {
			switch {
			case step == 0 && got >= 1<<20:
				step++
				shapeErr = errors.Join(shapeErr, site.Shape(Link{Delay: 30 * time.Millisecond, Jitter: 5 * time.Millisecond, Loss: 0.01, Rate: 20e6}))
			case step == 1 && got >= 2<<20:
				step++
				shapeErr = errors.Join(shapeErr, site.Shape(Link{}))
			}
		})
		if err != nil || shapeErr != nil {
			t.Fatalf("transfer while reshaping: %v; Shape: %v", err, shapeErr)
		}
		if step != 2 {
			t.Fatalf("transfer ended before both reshapes (step %d)", step)
		}
		if st := site.WANStats(); st.Down.Packets == before.Down.Packets {
			t.Errorf("delay line carried none of the download: %+v", st)
		}
	})

	t.Run("Restore", func(t *testing.T) {
		shape(Link{Delay: 40 * time.Millisecond, Jitter: 10 * time.Millisecond, Loss: 0.05, Rate: 10e6})
		shape(Link{})
		if l := site.Link(); !l.IsZero() {
			t.Errorf("Link() = %+v after Shape(Link{})", l)
		}
		checkUnshaped(t, site)
		r := runProbes(t, e1, echo, 100, 2*time.Millisecond, 2*time.Second)
		t.Logf("unshaped: %v", r)
		// A shaped link could not bring any probe back this fast.
		if r.received != r.sent || r.min() >= 80*time.Millisecond {
			t.Errorf("unshaped link: %d of %d probes came back, round trips %v", r.received, r.sent, r)
		}
		if err := site.SetLatency(0); err != nil {
			t.Errorf("SetLatency(0) on an unshaped link: %v", err)
		}
	})
}

// checkUnshaped checks that no trace of shaping is left on the site's
// uplink: no TUN devices, rules, loss tables or rate limits, and
// segmentation back to the default.
func checkUnshaped(t *testing.T, s *Site) {
	t.Helper()
	for _, e := range s.uplinkEnds() {
		link := e.h.Run(t, "ip", "-d", "link", "show", e.dev)
		if !strings.Contains(link, fmt.Sprintf("gso_max_segs %d ", defaultGSOMaxSegs)) {
			t.Errorf("%s in %s: %s", e.dev, e.h, link)
		}
		if q := e.h.Run(t, "tc", "qdisc", "show", "dev", e.dev); strings.Contains(q, "tbf") {
			t.Errorf("%s in %s still rate-limited: %s", e.dev, e.h, q)
		}
		if tables := e.h.Run(t, "nft", "list", "tables"); strings.Contains(tables, "tt_wan") {
			t.Errorf("%s still has loss rules: %s", e.h, tables)
		}
	}
	if links := s.cloud.Run(t, "ip", "-o", "link", "show"); strings.Contains(links, " wd0") || strings.Contains(links, " wu0") {
		t.Errorf("TUN devices left in the cloud router:\n%s", links)
	}
	if rules := s.cloud.Run(t, "ip", "rule", "show"); strings.Contains(rules, "100") && (strings.Contains(rules, "wd0") || strings.Contains(rules, "lookup 5")) {
		t.Errorf("routing rules left in the cloud router:\n%s", rules)
	}
}

// udpGSO sends a batch of datagrams as one UDP GSO write from site to
// cloud, and another back, and checks that each arrives as the datagrams
// it was made of.
func udpGSO(t *testing.T, cloud, site *Host) {
	t.Helper()
	const size, count = 1200, 10
	cpc, err := cloud.ListenPacket("udp4", netip.AddrPortFrom(cloud.Addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer cpc.Close()
	spc, err := site.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer spc.Close()
	batch := make([]byte, size*count)
	for i := range batch {
		batch[i] = byte(i / size)
	}
	// send writes the batch as one datagram buffer cut by the kernel
	// (UDP_SEGMENT), and returns the address it was sent from as seen
	// by the receiver.
	send := func(from, to net.PacketConn, toAddr net.Addr) net.Addr {
		t.Helper()
		raw, err := from.(*net.UDPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT, size)
		}); err != nil || serr != nil {
			t.Fatalf("UDP_SEGMENT: %v %v", err, serr)
		}
		if _, err := from.WriteTo(batch, toAddr); err != nil {
			t.Fatalf("GSO write: %v", err)
		}
		var src net.Addr
		buf := make([]byte, 2*len(batch))
		to.SetReadDeadline(time.Now().Add(10 * time.Second))
		for i := range count {
			n, addr, err := to.ReadFrom(buf)
			if err != nil {
				t.Fatalf("datagram %d of a GSO batch: %v", i, err)
			}
			if n != size || buf[0] != byte(i) || buf[n-1] != byte(i) {
				t.Fatalf("datagram %d of a GSO batch: %d bytes starting %d", i, n, buf[0])
			}
			src = addr
		}
		return src
	}
	natted := send(spc, cpc, cpc.LocalAddr())
	send(cpc, spc, natted)
}

// udpEcho echoes every datagram back to its sender and counts them.
type udpEcho struct {
	pc   net.PacketConn
	addr *net.UDPAddr
	got  atomic.Int64
}

// startUDPEcho runs a UDP echo server on h until the test ends.
func startUDPEcho(t *testing.T, h *Host) *udpEcho {
	t.Helper()
	pc, err := h.ListenPacket("udp", netip.AddrPortFrom(h.Addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	e := &udpEcho{pc: pc, addr: pc.LocalAddr().(*net.UDPAddr)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			e.got.Add(1)
			pc.WriteTo(buf[:n], from)
		}
	}()
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	return e
}

// probeResult is what a run of UDP probes measured.
type probeResult struct {
	sent, received int
	rtts           []time.Duration // sorted
	reordered      int             // replies that came after a later probe's
}

func (r probeResult) min() time.Duration    { return r.quantile(0) }
func (r probeResult) max() time.Duration    { return r.quantile(1) }
func (r probeResult) median() time.Duration { return r.quantile(0.5) }

func (r probeResult) quantile(q float64) time.Duration {
	if len(r.rtts) == 0 {
		return 0
	}
	return r.rtts[int(q*float64(len(r.rtts)-1))]
}

func (r probeResult) String() string {
	return fmt.Sprintf("%d/%d back, rtt min %v median %v p90 %v max %v, %d reordered",
		r.received, r.sent, r.min().Round(10*time.Microsecond), r.median().Round(10*time.Microsecond),
		r.quantile(0.9).Round(10*time.Microsecond), r.max().Round(10*time.Microsecond), r.reordered)
}

// runProbes sends n numbered, timestamped probes from h to the echo
// server, spaced by interval, and collects the replies until all are back
// or none has come for quiet after the last was sent.
func runProbes(t *testing.T, h *Host, echo *udpEcho, n int, interval, quiet time.Duration) probeResult {
	t.Helper()
	pc, err := h.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	base := time.Now()
	sendErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 64)
		for i := range n {
			binary.BigEndian.PutUint64(buf, uint64(i))
			binary.BigEndian.PutUint64(buf[8:], uint64(time.Since(base)))
			if _, err := pc.WriteTo(buf, echo.addr); err != nil {
				sendErr <- fmt.Errorf("probe %d: %w", i, err)
				return
			}
			time.Sleep(interval)
		}
		sendErr <- nil
	}()
	r := probeResult{sent: n}
	seen := make([]bool, n)
	last := -1
	buf := make([]byte, 2048)
	sending := true
	for r.received < n {
		pc.SetReadDeadline(time.Now().Add(quiet))
		m, _, err := pc.ReadFrom(buf)
		at := time.Since(base)
		if sending {
			select {
			case err := <-sendErr:
				sending = false
				if err != nil {
					t.Fatal(err)
				}
			default:
			}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && sending {
			continue // the sender is slow; wait on
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		} else if err != nil {
			t.Fatalf("read probe reply: %v", err)
		}
		if m < 16 {
			continue
		}
		seq := int(binary.BigEndian.Uint64(buf))
		if seq >= n || seen[seq] {
			continue
		}
		seen[seq] = true
		r.received++
		r.rtts = append(r.rtts, at-time.Duration(binary.BigEndian.Uint64(buf[8:])))
		if seq < last {
			r.reordered++
		}
		last = max(last, seq)
	}
	if sending {
		if err := <-sendErr; err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(r.rtts)
	return r
}

// bulk moves size bytes over one TCP connection that site (a site host)
// opens to cloud (a cloud host), from site to cloud or, for a download,
// back, and returns the bits per second the receiver got, counted from
// before the first byte was sent: the link can only make that lower than
// its rate. It checks the bytes that arrive. progress, if not nil, is
// called with the count received after each read.
func bulk(cloud, site *Host, size int, download bool, progress func(int)) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := cloud.Listen("tcp", netip.AddrPortFrom(cloud.Addr, 0).String())
	if err != nil {
		return 0, err
	}
	defer l.Close()
	c, err := site.DialContext(ctx, "tcp", l.Addr().String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	sc, err := l.Accept()
	if err != nil {
		return 0, err
	}
	defer sc.Close()
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	sc.SetDeadline(deadline)
	w, r := c, sc
	if download {
		w, r = sc, c
	}
	pattern := make([]byte, 64<<10)
	for i := range pattern {
		pattern[i] = byte(i % 251)
	}
	start := time.Now()
	wrote := make(chan error, 1)
	go func() {
		for sent := 0; sent < size; {
			chunk := pattern[:min(len(pattern)-len(pattern)%251, size-sent)]
			n, err := w.Write(chunk)
			sent += n
			if err != nil {
				wrote <- err
				return
			}
		}
		wrote <- w.(*net.TCPConn).CloseWrite()
	}()
	got := 0
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		for i, b := range buf[:n] {
			if b != byte((got+i)%251) {
				return 0, fmt.Errorf("byte %d of the stream is %d, want %d", got+i, b, (got+i)%251)
			}
		}
		got += n
		if progress != nil && n > 0 {
			progress(got)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("after %d of %d bytes: %w", got, size, err)
		}
	}
	elapsed := time.Since(start)
	if err := <-wrote; err != nil {
		return 0, fmt.Errorf("send: %w", err)
	}
	if got != size {
		return 0, fmt.Errorf("got %d bytes, sent %d", got, size)
	}
	return float64(got) * 8 / elapsed.Seconds(), nil
}

// BenchmarkShapeDelayLine measures what the delay line forwards on this
// machine: TCP bulk through a link with 1 ms of delay each way (MB/s, and
// the packets per second the line carries both ways), and a flood of
// small UDP datagrams site to cloud (datagrams per second that arrive).
//
//	go test -run '^$' -bench ShapeDelayLine ./internal/testenv/
func BenchmarkShapeDelayLine(b *testing.B) {
	RequireRoot(b)
	topo := NewTopology(b, TopologySpec{
		CloudHosts: []string{"gw"},
		Sites:      []SiteSpec{{Name: "far", Hosts: []string{"e1"}}},
	})
	site := topo.Site("far")
	gw, e1 := topo.Cloud("gw"), site.Host("e1")
	if err := site.Shape(Link{Delay: time.Millisecond}); err != nil {
		b.Fatal(err)
	}
	packets := func() uint64 { st := site.WANStats(); return st.Up.Packets + st.Down.Packets }

	b.Run("tcp", func(b *testing.B) {
		const size = 16 << 20
		b.SetBytes(size)
		p0, start := packets(), time.Now()
		for range b.N {
			if _, err := bulk(gw, e1, size, false, nil); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(packets()-p0)/time.Since(start).Seconds(), "pkts/s")
	})

	b.Run("udp", func(b *testing.B) {
		sink, err := gw.ListenPacket("udp4", netip.AddrPortFrom(gw.Addr, 0).String())
		if err != nil {
			b.Fatal(err)
		}
		var got atomic.Int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 2048)
			for {
				if _, _, err := sink.ReadFrom(buf); err != nil {
					return
				}
				got.Add(1)
			}
		}()
		defer func() { sink.Close(); <-done }()
		src, err := e1.ListenPacket("udp4", "0.0.0.0:0")
		if err != nil {
			b.Fatal(err)
		}
		defer src.Close()
		msg := make([]byte, 100)
		dropped0 := site.WANStats().Up.Dropped
		start := time.Now()
		for range b.N {
			for range 1000 {
				src.WriteTo(msg, sink.LocalAddr())
			}
		}
		sent := time.Since(start)
		// Let the line drain (it holds 1 ms), then count.
		time.Sleep(200 * time.Millisecond)
		b.ReportMetric(float64(got.Load())/sent.Seconds(), "arrived/s")
		b.ReportMetric(float64(1000*b.N)/sent.Seconds(), "sent/s")
		b.ReportMetric(float64(site.WANStats().Up.Dropped-dropped0), "line-drops")
	})
}
