package testenv

// WAN emulation: delay, jitter, loss and a rate limit on a site's uplink.
//
// The kernel these tests run on has no netem, so Site.Shape builds each
// impairment from what exists:
//
//	 cloud router                                      site router
//	 br0 ──rule: to 100.64.i.0/24──▶ wd<i> ┐
//	                                 TUN  │ delay line (goroutines)
//	     ◀──────────── main table ◀─ wd<i> ┘ ──▶ s<i> [tbf] ══▶ wan0 [loss]
//	                                                            (netdev ingress)
//	 br0 ◀── main table ◀── wu<i> ┐
//	                      TUN    │ delay line
//	       rule: iif s<i> ──▶ wu<i> ┘ ◀── s<i> [loss] ◀══ [tbf] wan0
//
//   - Delay and jitter: a userspace forwarder in the cloud router, one
//     TUN device per direction. Policy routing sends what crosses the
//     uplink into the TUN device (rule `to <uplink /24> lookup <table>` for
//     the way down, `iif s<i> lookup <table>` for the way up); a goroutine
//     reads each packet, a second writes it back into the same device once
//     it is due, and the kernel routes it on (`iif wd<i> lookup main` keeps
//     it from looping). The forwarder lives in the cloud router rather than
//     the site router because the cloud router does no NAT: a packet that
//     crosses the site router's netfilter twice would meet its own
//     conntrack entry on the second pass and escape masquerading.
//   - Loss: an nftables rule on the receiving end of each direction
//     (netdev ingress of wan0 in the site router, of s<i> in the cloud
//     router) drops `numgen random mod 1000000 < Loss*1000000`.
//   - Rate: a tbf queueing discipline at the root of the sending end of
//     each direction (s<i> and wan0).
//
// Segmentation offloads. Senders on veth hand the kernel GSO and TSO
// super-packets (up to 64 KB of TCP, or of UDP as quic-go sends it) that
// travel whole until a device without the offload cuts them up. While a
// link has loss or a rate, both uplink ends have gso_max_segs 1, so that
// they are cut into wire-sized packets before tbf or the loss rule see
// them: loss and rate count real packets, not 64 KB batches of them. The
// TUN devices take the offloads (IFF_VNET_HDR, TUNSETOFFLOAD): the delay
// line reads and writes super-packets whole, with their virtio-net
// header, which keeps its packet rate (the cost) low for bulk traffic.
//
// Limits: what the site sends to the cloud router's own addresses is not
// delayed (the local routing table comes before the rules); the cloud
// router's conf/all/rp_filter is set to 0 while a delay line runs (its
// other devices keep their own setting); the delay line costs two
// syscalls per packet or super-packet and direction: on a busy 2-core
// machine it carried about 100 MB/s of TCP and 80,000 small UDP packets
// per second (BenchmarkShapeDelayLine).

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Link describes a WAN link's impairments, applied in each direction of a
// site's uplink. The zero Link is an unimpaired link.
type Link struct {
	// Delay is the one-way delay added in each direction: round trips
	// across the uplink grow by 2*Delay.
	Delay time.Duration
	// Jitter varies each packet's delay uniformly within Delay±Jitter
	// (never below zero). Packets keep their order: one that draws a
	// shorter delay than the packet before it waits for that one, so in a
	// dense flow delays lean towards Delay+Jitter; sparse packets (spaced
	// by more than 2*Jitter) get the plain uniform spread.
	Jitter time.Duration
	// Loss is the fraction of packets dropped in each direction, 0 to 1,
	// independently for each packet. A round trip succeeds with
	// probability (1-Loss)².
	Loss float64
	// Rate limits each direction to this many bits per second, counting
	// Ethernet frames (IP packet plus 14 bytes); 0 is unlimited. The
	// bottleneck queue holds one round trip (2*Delay, at least 50 ms) of
	// data at that rate; beyond it packets are dropped.
	Rate int64
}

// IsZero reports whether l shapes nothing.
func (l Link) IsZero() bool { return l == Link{} }

// String describes l for logs: "delay=40ms jitter=5ms loss=1% rate=20Mbit/s".
func (l Link) String() string {
	if l.IsZero() {
		return "unshaped"
	}
	var parts []string
	if l.Delay > 0 {
		parts = append(parts, "delay="+l.Delay.String())
	}
	if l.Jitter > 0 {
		parts = append(parts, "jitter="+l.Jitter.String())
	}
	if l.Loss > 0 {
		parts = append(parts, "loss="+strconv.FormatFloat(100*l.Loss, 'g', 4, 64)+"%")
	}
	if l.Rate > 0 {
		parts = append(parts, "rate="+strconv.FormatFloat(float64(l.Rate)/1e6, 'g', 6, 64)+"Mbit/s")
	}
	return strings.Join(parts, " ")
}

// Validate checks that l can be applied.
func (l Link) Validate() error {
	switch {
	case l.Delay < 0 || l.Jitter < 0:
		return fmt.Errorf("negative delay %v or jitter %v", l.Delay, l.Jitter)
	case l.Delay > maxWANDelay || l.Jitter > maxWANDelay:
		return fmt.Errorf("delay %v or jitter %v above %v", l.Delay, l.Jitter, maxWANDelay)
	case !(l.Loss >= 0 && l.Loss <= 1): // also refuses NaN
		return fmt.Errorf("loss %v outside 0..1", l.Loss)
	case l.Rate < 0 || (l.Rate > 0 && l.Rate < minWANRate):
		return fmt.Errorf("rate %d bit/s: want 0 (unlimited) or at least %d", l.Rate, minWANRate)
	}
	return nil
}

// WANStats counts what a site's delay forwarder has done since the
// topology was built (the counts survive reshaping). Packets that tbf or
// the loss rule drop are not in it.
type WANStats struct {
	// Down is the way from the cloud to the site, Up the way back.
	Down, Up WANLineStats
}

// WANLineStats counts one direction of the delay forwarder.
type WANLineStats struct {
	// Packets and Bytes (of IP packets) went through the delay line; a
	// GSO super-packet counts as one packet.
	Packets, Bytes uint64
	// Dropped were refused because the line was full (more than
	// wanQueuePackets packets or wanQueueBytes bytes of buffers, its
	// memory bound), or could not be written back.
	Dropped uint64
}

const (
	// maxWANDelay bounds Delay and Jitter: a delay line holds at most
	// that much of the link's traffic.
	maxWANDelay = 10 * time.Second
	// minWANRate is the lowest rate tbf is asked for.
	minWANRate = 8000
	// wanQueuePackets and wanQueueBytes bound each direction of the
	// delay line: packets beyond either are dropped and counted. 32 MiB
	// is 100 ms of 2.7 Gbit/s, more than the forwarder sustains.
	wanQueuePackets = 16384
	wanQueueBytes   = 32 << 20
	// vnetHdrLen is the size of the virtio-net header before each packet
	// on a TUN device with IFF_VNET_HDR (struct virtio_net_hdr).
	vnetHdrLen = 10
	// maxTUNPacket is the largest packet a TUN device with offloads
	// passes: a 64 KB super-packet and its header.
	maxTUNPacket = vnetHdrLen + 65535
	// TUNSETOFFLOAD flags (linux/if_tun.h).
	tunFCsum   = 0x01
	tunFTSO4   = 0x02
	tunFTSO6   = 0x04
	tunFTSOECN = 0x08
	tunFUSO4   = 0x20
	tunFUSO6   = 0x40
	// lossScale is the resolution of the loss rule's random draw.
	lossScale = 1_000_000
	// minTBFQueue is the least time's worth of data tbf queues.
	minTBFQueue = 50 * time.Millisecond
	// tbfBurstTime sizes tbf's bucket: 5 ms of line time (at least two
	// full frames), so bursts stay short.
	tbfBurstTime = 5 * time.Millisecond
	// defaultGSOMaxSegs is the kernel's gso_max_segs for veth devices,
	// restored when shaping ends.
	defaultGSOMaxSegs = 65535
	// Policy routing in the cloud router for site i's delay line: rules
	// at these preferences, routes in tables wanTableDown+i and
	// wanTableUp+i.
	wanPrefMain  = 1000
	wanPrefTun   = 1001
	wanTableDown = 5000
	wanTableUp   = 5300
)

// wanShaper is a site's WAN emulation state.
type wanShaper struct {
	mu      sync.Mutex
	link    Link       // as last applied
	fwd     *forwarder // nil without delay
	cleanup bool       // the cleanup that unshapes is registered
	stats   [2]lineCounters
}

// Shape applies l to the site's uplink, in both directions: every
// impairment l sets replaces what an earlier Shape set, and the zero Link
// removes all shaping. It may be called again while traffic flows, to
// change the link: packets already in the delay line keep their order and
// the delay they were given, except when the new link has no delay or
// jitter: the delay line then ends and sends what it holds at once.
// Shaping ends, at the latest, when the topology's test cleans up.
//
// The loss rules live in nftables tables named tt_wan_<device>, the rate
// limits are root qdiscs of the uplink's two ends; replacing those
// (`nft flush ruleset`, `tc qdisc replace ... root`) undoes part of Shape.
func (s *Site) Shape(l Link) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("shape uplink of site %s: %w", s.Name, err)
	}
	w := &s.wan
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.cleanup && !l.IsZero() {
		w.cleanup = true
		s.t.Cleanup(func() {
			if err := s.Shape(Link{}); err != nil {
				s.t.Logf("testenv: %v", err)
			}
		})
	}
	if err := s.shape(l); err != nil {
		return fmt.Errorf("shape uplink of site %s (%v): %w", s.Name, l, err)
	}
	w.link = l
	return nil
}

// Link returns what the last successful Shape applied.
func (s *Site) Link() Link {
	s.wan.mu.Lock()
	defer s.wan.mu.Unlock()
	return s.wan.link
}

// WANStats returns the delay forwarder's counters.
func (s *Site) WANStats() WANStats {
	return WANStats{Down: s.wan.stats[down].snapshot(), Up: s.wan.stats[up].snapshot()}
}

// shape makes the uplink match l. Each step sets its part of the state
// whatever it was before, so a Shape after a failed one repairs it.
func (s *Site) shape(l Link) error {
	w := &s.wan
	ends := s.uplinkEnds()
	// Segment before anything counts packets; undo last.
	segment := l.Loss > 0 || l.Rate > 0
	if segment {
		if err := setGSOMaxSegs(ends, 1); err != nil {
			return err
		}
	}
	for _, e := range ends {
		if err := e.setLoss(l.Loss); err != nil {
			return err
		}
		if err := e.setRate(l); err != nil {
			return err
		}
	}
	switch delayed := l.Delay > 0 || l.Jitter > 0; {
	case delayed && w.fwd == nil:
		f, err := startForwarder(s, l)
		if err != nil {
			return err
		}
		w.fwd = f
	case delayed:
		w.fwd.link.Store(&l)
	case w.fwd != nil:
		err := w.fwd.stop()
		w.fwd = nil
		if err != nil {
			return err
		}
	}
	if !segment {
		return setGSOMaxSegs(ends, defaultGSOMaxSegs)
	}
	return nil
}

// uplinkEnd is one end of the uplink veth: the device, and the namespace
// it is in.
type uplinkEnd struct {
	h   *Host
	dev string
}

// uplinkEnds returns the site router's end (wan0) and the cloud router's
// (s<i>).
func (s *Site) uplinkEnds() []uplinkEnd {
	return []uplinkEnd{{s.router, siteUplink}, {s.cloud, s.uplink}}
}

// setGSOMaxSegs sets gso_max_segs on both ends.
func setGSOMaxSegs(ends []uplinkEnd, n int) error {
	for _, e := range ends {
		if err := ipSteps(e.h.Name, fmt.Sprintf("link set %s gso_max_segs %d", e.dev, n)); err != nil {
			return fmt.Errorf("segmentation on %s: %w", e.dev, err)
		}
	}
	return nil
}

// setLoss drops the fraction loss of what arrives on this end.
func (e uplinkEnd) setLoss(loss float64) error {
	table := "tt_wan_" + e.dev
	rules := fmt.Sprintf("table netdev %[1]s {}\ndelete table netdev %[1]s\n", table)
	if n := int64(loss*lossScale + 0.5); n > 0 {
		rules += fmt.Sprintf(`table netdev %s {
	chain loss {
		type filter hook ingress device %q priority -500; policy accept;
		numgen random mod %d < %d counter drop
	}
}
`, table, e.dev, lossScale, n)
	}
	if _, err := e.h.runInput([]byte(rules), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("loss on %s: %w", e.dev, err)
	}
	return nil
}

// setRate limits what this end sends to l.Rate, or removes the limit.
func (e uplinkEnd) setRate(l Link) error {
	if l.Rate == 0 {
		out, err := e.h.run("tc", "qdisc", "del", "dev", e.dev, "root")
		if err != nil && !strings.Contains(out, "handle of zero") && !strings.Contains(out, "No such file") {
			return fmt.Errorf("remove rate limit on %s: %w", e.dev, err)
		}
		return nil
	}
	bytesPerSec := float64(l.Rate) / 8
	burst := max(int64(bytesPerSec*tbfBurstTime.Seconds()), 2*1514)
	limit := burst + int64(bytesPerSec*max(2*l.Delay, minTBFQueue).Seconds())
	_, err := e.h.run("tc", "qdisc", "replace", "dev", e.dev, "root", "tbf",
		"rate", fmt.Sprintf("%dbit", l.Rate), "burst", strconv.FormatInt(burst, 10),
		"limit", strconv.FormatInt(limit, 10))
	if err != nil {
		return fmt.Errorf("rate limit on %s: %w", e.dev, err)
	}
	return nil
}

// Directions of the delay line.
const (
	down = 0 // cloud to site
	up   = 1 // site to cloud
)

// lineCounters are WANLineStats, updated as packets pass.
type lineCounters struct {
	packets, bytes, dropped atomic.Uint64
}

func (c *lineCounters) snapshot() WANLineStats {
	return WANLineStats{Packets: c.packets.Load(), Bytes: c.bytes.Load(), Dropped: c.dropped.Load()}
}

// forwarder is the delay line of one site's uplink, both directions, in
// the cloud router.
type forwarder struct {
	cloud *Host
	rules []string // ip rule arguments to delete on stop
	link  atomic.Pointer[Link]
	lines [2]*delayLine
	wg    sync.WaitGroup
}

// delayLine is one direction: packets read from a TUN device wait in q
// until due, then are written back into it.
type delayLine struct {
	f        *os.File
	link     *atomic.Pointer[Link]
	stats    *lineCounters
	small    sync.Pool // *[]byte of cap smallCap, for packets up to the MTU
	large    sync.Pool // *[]byte of cap maxTUNPacket, for super-packets
	smallCap int
	queued   atomic.Int64 // bytes of buffers in q
	q        chan packet
	flush    chan struct{} // closed to write out what is queued at once
	err      error         // why the reader stopped early, if it did
}

// packet is one packet in a delay line.
type packet struct {
	b   *[]byte
	due time.Time
}

// startForwarder creates the TUN devices in the cloud router, starts the
// delay lines and then routes the uplink's traffic through them.
func startForwarder(s *Site, l Link) (*forwarder, error) {
	i, err := strconv.Atoi(strings.TrimPrefix(s.uplink, "s"))
	if err != nil {
		return nil, fmt.Errorf("uplink %q: no site number", s.uplink)
	}
	prefix := netip.PrefixFrom(s.PublicAddr, 24).Masked()
	cloudEnd := nthAddr(prefix, 1)
	devs := [2]string{down: fmt.Sprintf("wd%d", i), up: fmt.Sprintf("wu%d", i)}

	f := &forwarder{cloud: s.cloud}
	f.link.Store(&l)
	var files [2]*os.File
	var mtu int
	err = s.cloud.Do(func() error {
		ifi, err := net.InterfaceByName(s.uplink)
		if err != nil {
			return err
		}
		mtu = ifi.MTU
		// A device's effective rp_filter is the larger of its own and
		// conf/all's: take conf/all out of the way (the cloud router's
		// other devices keep their own setting).
		if b, err := os.ReadFile("/proc/sys/net/ipv4/conf/all/rp_filter"); err != nil {
			return err
		} else if strings.TrimSpace(string(b)) != "0" {
			if err := writeSysctl("ipv4/conf/all/rp_filter", "0"); err != nil {
				return err
			}
		}
		for d, dev := range devs {
			if files[d], err = openTUN(dev); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		for _, file := range files {
			if file != nil {
				file.Close()
			}
		}
		return nil, fmt.Errorf("delay line: %w", err)
	}
	for d := range devs {
		line := &delayLine{
			f: files[d], link: &f.link, stats: &s.wan.stats[d], smallCap: vnetHdrLen + mtu,
			q: make(chan packet, wanQueuePackets), flush: make(chan struct{}),
		}
		line.small.New = func() any { b := make([]byte, line.smallCap); return &b }
		line.large.New = func() any { b := make([]byte, maxTUNPacket); return &b }
		f.lines[d] = line
		f.wg.Add(2)
		go func() { defer f.wg.Done(); line.read() }()
		go func() { defer f.wg.Done(); line.write() }()
	}
	err = ipSteps(s.cloud.Name,
		fmt.Sprintf("link set %s mtu %d up", devs[down], mtu),
		fmt.Sprintf("link set %s mtu %d up", devs[up], mtu),
		fmt.Sprintf("route replace %s dev %s src %s table %d", prefix, devs[down], cloudEnd, wanTableDown+i),
		fmt.Sprintf("route replace default dev %s table %d", devs[up], wanTableUp+i),
	)
	// What the lines write back is routed normally; then what crosses the
	// uplink goes into them.
	for _, r := range []string{
		fmt.Sprintf("pref %d iif %s lookup main", wanPrefMain, devs[down]),
		fmt.Sprintf("pref %d to %s lookup %d", wanPrefTun, prefix, wanTableDown+i),
		fmt.Sprintf("pref %d iif %s lookup %d", wanPrefTun, s.uplink, wanTableUp+i),
	} {
		if err != nil {
			break
		}
		if err = ipSteps(s.cloud.Name, "rule add "+r); err == nil {
			f.rules = append(f.rules, r)
		}
	}
	if err != nil {
		f.stop()
		return nil, fmt.Errorf("delay line: %w", err)
	}
	return f, nil
}

// openTUN creates TUN device name (no packet information header; a
// virtio-net header and segmentation offloads) in the calling thread's
// namespace and returns it as a non-blocking, pollable file.
func openTUN(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err == nil {
		// UDP segmentation (USO) is newer (Linux 6.2) than TCP's.
		const tcp = tunFCsum | tunFTSO4 | tunFTSO6 | tunFTSOECN
		if err = unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tcp|tunFUSO4|tunFUSO6); err != nil {
			err = unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tcp)
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create TUN device %s: %w", name, err)
	}
	// What the forwarder writes back comes from other interfaces'
	// addresses (and, for the cloud router's own traffic, from its own):
	// no reverse-path filtering on the device (even loose filtering fails
	// with the policy rules that route the uplink through the line; the
	// effective value is the larger of the device's and conf/all's, see
	// startForwarder), local sources accepted. IPv6 off: nothing of it
	// should enter the line.
	for _, kv := range [][2]string{
		{"ipv4/conf/" + name + "/rp_filter", "0"},
		{"ipv4/conf/" + name + "/accept_local", "1"},
		{"ipv6/conf/" + name + "/disable_ipv6", "1"},
	} {
		err := writeSysctl(kv[0], kv[1])
		if err != nil && !(errors.Is(err, os.ErrNotExist) && strings.HasPrefix(kv[0], "ipv6")) {
			unix.Close(fd)
			return nil, fmt.Errorf("TUN device %s: %w", name, err)
		}
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}

// writeSysctl sets /proc/sys/net/<key> in the calling thread's namespace.
func writeSysctl(key, value string) error {
	return os.WriteFile("/proc/sys/net/"+key, []byte(value), 0)
}

// stop routes the uplink's traffic past the delay lines again, writes out
// what they hold at once, and closes the TUN devices (which removes them
// with their routes).
func (f *forwarder) stop() error {
	var errs []error
	for _, r := range f.rules {
		if err := ipSteps(f.cloud.Name, "rule del "+r); err != nil {
			errs = append(errs, err)
		}
	}
	for _, line := range f.lines {
		if line == nil {
			continue
		}
		close(line.flush)
		line.f.SetReadDeadline(time.Now())
	}
	f.wg.Wait()
	for _, line := range f.lines {
		if line == nil {
			continue
		}
		if line.err != nil {
			errs = append(errs, line.err)
		}
		if err := line.f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop delay line: %w", err)
	}
	return nil
}

// read takes packets from the TUN device and queues them with their due
// time, until the read deadline is set or the device fails.
func (l *delayLine) read() {
	defer close(l.q)
	scratch := make([]byte, maxTUNPacket)
	var last time.Time
	for {
		n, err := l.f.Read(scratch)
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, os.ErrClosed) {
				l.err = fmt.Errorf("read %s: %w", l.f.Name(), err)
			}
			return
		}
		if n <= vnetHdrLen || scratch[vnetHdrLen]>>4 != 4 {
			continue // IPv4 only
		}
		link := l.link.Load()
		now := time.Now()
		d := link.Delay
		if j := int64(link.Jitter); j > 0 {
			d += time.Duration(rand.Int64N(2*j+1) - j)
		}
		due := now.Add(max(d, 0))
		if due.Before(last) {
			due = last // keep order
		}
		last = due
		b := l.get(n)
		copy(*b, scratch[:n])
		if l.queued.Add(int64(cap(*b))) > wanQueueBytes {
			l.drop(b)
			continue
		}
		select {
		case l.q <- packet{b: b, due: due}:
		default:
			l.drop(b)
		}
	}
}

// drop counts a packet that did not fit in the line and frees its buffer.
func (l *delayLine) drop(b *[]byte) {
	l.stats.dropped.Add(1)
	l.put(b)
}

// get returns a pooled buffer of length n (at most maxTUNPacket).
func (l *delayLine) get(n int) *[]byte {
	pool := &l.small
	if n > l.smallCap {
		pool = &l.large
	}
	b := pool.Get().(*[]byte)
	*b = (*b)[:n]
	return b
}

// put returns a buffer from get, which no longer counts as queued.
func (l *delayLine) put(b *[]byte) {
	l.queued.Add(-int64(cap(*b)))
	if cap(*b) == l.smallCap {
		l.small.Put(b)
	} else {
		l.large.Put(b)
	}
}

// write writes each queued packet back into the TUN device when it is due
// (at once after flush is closed), until read has closed the queue.
func (l *delayLine) write() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	flushing := false
	for p := range l.q {
		if wait := time.Until(p.due); wait > 0 && !flushing {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-l.flush:
				flushing = true
			}
		}
		if _, err := l.f.Write(*p.b); err != nil {
			l.stats.dropped.Add(1)
		} else {
			l.stats.packets.Add(1)
			l.stats.bytes.Add(uint64(len(*p.b) - vnetHdrLen))
		}
		l.put(p.b)
	}
}
