package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/world"
)

// churnResult is the Node churn phase.
type churnResult struct {
	added, removed, failed int
	took                   time.Duration
	probes                 int
	dns, dnat              []time.Duration // created → answered / DNATed; sorted
	dnsMiss, dnatMiss      int             // not within churnProbeLimit
	firstErr               error
	cpuPct                 float64
}

const (
	// churnLifetime is how long a churned Node lives.
	churnLifetime = 5 * time.Second
	// churnProbeLimit bounds the wait for a probed node to be answered.
	churnProbeLimit = 10 * time.Second
	churnProbeEvery = 20 * time.Millisecond
)

func churnName(k int) string { return fmt.Sprintf("churn-%d", k) }

// churn adds --churn-rate Nodes per second, each removed churnLifetime
// later, for --churn-duration, and probes how soon every --churn-probe'th
// one is answered by the gateway's DNS and reached through its DNAT (a
// connection to its kubelet port accepted by the transparent listener;
// nothing is connected behind it).
func (b *bench) churn(ctx context.Context, res *results) error {
	g := b.gws[0]
	if g == nil {
		return errors.New("no gateway running")
	}
	total := int(float64(b.o.churnRate) * b.o.churnDuration.Seconds())
	if total > maxChurn {
		return fmt.Errorf("--churn-rate × --churn-duration is more than %d nodes", maxChurn)
	}
	r := &churnResult{}
	res.churn = r
	note("churn: %d Nodes added and removed per second for %v (each lives %v), probing every %dth", b.o.churnRate, b.o.churnDuration, churnLifetime, b.o.churnProbe)
	b.profile(ctx, g, "churn", b.o.churnDuration)

	var mu sync.Mutex
	var probes, deletes sync.WaitGroup
	creates := make(chan int, total)
	removes := make(chan int, total)
	var workers sync.WaitGroup
	fail := func(err error) {
		mu.Lock()
		r.failed++
		if r.firstErr == nil {
			r.firstErr = err
		}
		mu.Unlock()
	}
	for range b.o.createParallel {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				select {
				case k, ok := <-creates:
					if !ok {
						return
					}
					addr := addrAt(churnBase, k+1)
					if err := createNode(ctx, b.admin, churnName(k), addr, "churn", netip.Prefix{}); err != nil {
						fail(err)
						continue
					}
					created := time.Now()
					mu.Lock()
					r.added++
					mu.Unlock()
					if k%b.o.churnProbe == 0 {
						probes.Add(1)
						go func() {
							defer probes.Done()
							b.probeChurned(ctx, k, addr, created, r, &mu)
						}()
					}
					deletes.Add(1)
					time.AfterFunc(churnLifetime, func() { removes <- k })
				case k := <-removes:
					err := b.admin.CoreV1().Nodes().Delete(ctx, churnName(k), metav1.DeleteOptions{})
					deletes.Done()
					if err != nil {
						fail(fmt.Errorf("delete node %s: %w", churnName(k), err))
						continue
					}
					mu.Lock()
					r.removed++
					mu.Unlock()
				}
			}
		}()
	}

	cpu0, start := benchkit.CPU(g.pid), time.Now()
	stop := benchkit.Progress(ctx, 10*time.Second, func() {
		mu.Lock()
		defer mu.Unlock()
		el := time.Since(start)
		note("churn: %v: %d added, %d removed, gateway CPU %.0f%% of a core", el.Round(time.Second), r.added, r.removed,
			100*(benchkit.CPU(g.pid)-cpu0).Seconds()/el.Seconds())
	})
	tick := time.NewTicker(10 * time.Millisecond)
	for sent := 0; sent < total && ctx.Err() == nil; {
		<-tick.C
		due := min(total, int(float64(b.o.churnRate)*time.Since(start).Seconds()))
		for ; sent < due; sent++ {
			creates <- sent
		}
	}
	tick.Stop()
	// Every create done, then every removal (they keep the workers).
	for len(creates) > 0 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	r.took = time.Since(start)
	r.cpuPct = 100 * (benchkit.CPU(g.pid) - cpu0).Seconds() / r.took.Seconds()
	stop()
	probes.Wait()
	deletes.Wait()
	close(creates)
	workers.Wait()
	slices.Sort(r.dns)
	slices.Sort(r.dnat)
	note("churn: %d added, %d removed in %v (%d failed), DNS p99 %s ms, DNAT p99 %s ms, %d/%d probes not fresh within %v, gateway CPU %.0f%%",
		r.added, r.removed, r.took.Round(100*time.Millisecond), r.failed, ms(benchkit.Pct(r.dns, 99)), ms(benchkit.Pct(r.dnat, 99)), r.dnsMiss+r.dnatMiss, 2*r.probes, churnProbeLimit, r.cpuPct)
	return ctx.Err()
}

// probeChurned measures how soon churned node k is answered by the
// gateway's DNS and DNATed to its transparent listener, from the moment
// its Node was created.
func (b *bench) probeChurned(ctx context.Context, k int, addr netip.Addr, created time.Time, r *churnResult, mu *sync.Mutex) {
	gw := b.gws[0]
	dnsServer := net.JoinHostPort(gw.host.Addr.String(), "53")
	name := churnName(k) + "." + strings.TrimSuffix(world.Zone, ".") + "."
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		d, ok := b.until(ctx, created, func(ctx context.Context) bool { return b.dnsAnswers(ctx, dnsServer, name, addr) })
		mu.Lock()
		r.probes++
		if ok {
			r.dns = append(r.dns, d)
		} else {
			r.dnsMiss++
		}
		mu.Unlock()
	}()
	go func() {
		defer wg.Done()
		target := net.JoinHostPort(addr.String(), fmt.Sprint(world.KubeletPort))
		d, ok := b.until(ctx, created, func(ctx context.Context) bool {
			c, err := b.w.Client.DialContext(ctx, "tcp", target)
			if err != nil {
				return false
			}
			c.Close()
			return true
		})
		mu.Lock()
		if ok {
			r.dnat = append(r.dnat, d)
		} else {
			r.dnatMiss++
		}
		mu.Unlock()
	}()
	wg.Wait()
}

// until tries f every churnProbeEvery (each try bounded by 300 ms) until
// it holds, and says how long after since that was.
func (b *bench) until(ctx context.Context, since time.Time, f func(context.Context) bool) (time.Duration, bool) {
	for time.Since(since) < churnProbeLimit && ctx.Err() == nil {
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		ok := f(tctx)
		cancel()
		if ok {
			return time.Since(since), true
		}
		time.Sleep(churnProbeEvery)
	}
	return 0, false
}

// dnsAnswers asks server, from the cloud client host, for name's A record
// and reports whether it is want.
func (b *bench) dnsAnswers(ctx context.Context, server, name string, want netip.Addr) bool {
	c, err := b.w.Client.DialContext(ctx, "udp", server)
	if err != nil {
		return false
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	conn := &dns.Conn{Conn: c}
	q := new(dns.Msg)
	q.SetQuestion(name, dns.TypeA)
	if err := conn.WriteMsg(q); err != nil {
		return false
	}
	m, err := conn.ReadMsg()
	if err != nil {
		return false
	}
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			if got, ok := netip.AddrFromSlice(a.A); ok && got.Unmap() == want {
				return true
			}
		}
	}
	return false
}
