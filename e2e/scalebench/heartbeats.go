package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/poolstore/record"
)

// hbPhase is the delegated heartbeats phase.
type hbPhase struct {
	offline, pools int
	took           time.Duration // of the renewals
	agent          hbResult
	written        int             // Lease updates a watch saw carrying a leader's renewal
	lat            []time.Duration // renewTime (the leader's send) → seen by the watch; sorted
}

func (h *hbPhase) rate() float64 { return float64(h.written) / h.took.Seconds() }

// lost is the renewals sent that were not written: refused, failed, or
// answered OK but never seen in a Lease update.
func (h *hbPhase) lost() int { return int(h.agent.Sent) - h.written }

func (r *results) hbSummary() (float64, int) {
	if r.hb == nil {
		return -1, -1
	}
	return r.hb.rate(), r.hb.lost()
}

// hbPools are the pools of the phase: in each pool of 10 the first edge
// leads and the other 9 are offline, until offline edges are taken.
func hbPools(edges, offline int) []hbPool {
	var pools []hbPool
	left := offline
	for p := 0; left > 0 && p*poolSize+2 <= edges; p++ {
		pool := hbPool{Leader: p*poolSize + 1}
		for i := p*poolSize + 2; i <= min(p*poolSize+poolSize, edges) && left > 0; i++ {
			pool.Members = append(pool.Members, i)
			left--
		}
		pools = append(pools, pool)
	}
	return pools
}

func (b *bench) heartbeats(ctx context.Context, res *results) error {
	g := b.gws[0]
	if g == nil {
		return errors.New("no gateway running")
	}
	pools := hbPools(b.o.edges, b.o.hbOffline)
	var members []int
	for _, p := range pools {
		members = append(members, p.Members...)
	}
	if len(members) == 0 {
		note("heartbeats: no edge to take offline; skipped")
		return nil
	}
	h := &hbPhase{offline: len(members), pools: len(pools)}
	res.hb = h
	note("heartbeats: %d offline edges in %d pools; election records and Leases", h.offline, h.pools)
	if err := b.hbObjects(ctx, pools); err != nil {
		return err
	}
	if err := b.agent.stop(ctx, members); err != nil {
		return err
	}
	if err := b.waitCount(ctx, g, b.o.edges-len(members), time.Minute); err != nil {
		return err
	}

	// The watch sees every Lease update; a renewal's renewTime is the
	// moment its leader sent it.
	list, err := b.admin.CoordinationV1().Leases(leaseNamespace).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return err
	}
	var mu sync.Mutex
	wctx, wcancel := context.WithCancel(ctx)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- b.watchLeases(wctx, list.ResourceVersion, func(l *coordinationv1.Lease, seen time.Time) {
			if l.Annotations[openyurt.DelegateHeartbeatAnnotation] != "true" || l.Spec.RenewTime == nil {
				return
			}
			mu.Lock()
			h.written++
			h.lat = append(h.lat, seen.Sub(l.Spec.RenewTime.Time))
			mu.Unlock()
		})
	}()
	defer wcancel()

	note("heartbeats: leaders renewing every %v for %v (%.0f renewals/s wanted)", b.o.hbInterval, b.o.hbDuration,
		float64(h.offline)/b.o.hbInterval.Seconds())
	b.profile(ctx, g, "heartbeats", b.o.hbDuration)
	start := time.Now()
	last := 0
	stop := benchkit.Progress(ctx, 10*time.Second, func() {
		mu.Lock()
		n := h.written
		lat := slices.Clone(h.lat)
		mu.Unlock()
		slices.Sort(lat)
		note("heartbeats: %v: %d written (%.0f/s over the last 10 s), p99 send → Lease update %s ms", time.Since(start).Round(time.Second), n,
			float64(n-last)/10, ms(benchkit.Pct(lat, 99)))
		last = n
	})
	err = b.agent.call(ctx, "POST", "/heartbeats", hbRequest{Pools: pools, Interval: b.o.hbInterval, Duration: b.o.hbDuration}, &h.agent)
	stop()
	h.took = time.Since(start)
	if err != nil {
		return err
	}
	// The last renewals' updates may still be on their way.
	for prev := -1; ; {
		mu.Lock()
		n := h.written
		mu.Unlock()
		if n == prev || n >= int(h.agent.OK) {
			break
		}
		prev = n
		if err := benchkit.Sleep(ctx, 2*time.Second); err != nil {
			return err
		}
	}
	wcancel()
	if err := <-watchDone; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	mu.Lock()
	slices.Sort(h.lat)
	mu.Unlock()
	note("heartbeats: %d sent, %d answered ok, %d written (%.1f/s), p99 %s ms, %d lost; errors %v", h.agent.Sent, h.agent.OK, h.written,
		h.rate(), ms(benchkit.Pct(h.lat, 99)), h.lost(), h.agent.Errors)

	note("heartbeats: the offline edges come back")
	if err := b.agent.start(ctx, members, b.gatewayAddr(0)); err != nil {
		return err
	}
	return b.waitCount(ctx, g, b.o.edges, b.o.registerWait)
}

// hbObjects creates what the phase needs: each pool's election record
// naming its leader (as the pool's election would have written it, valid
// for an hour) and each offline member's Lease.
func (b *bench) hbObjects(ctx context.Context, pools []hbPool) error {
	cms := b.admin.CoreV1().ConfigMaps(record.Namespace)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: record.Namespace}}
	if _, err := b.admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	now := metav1.Now()
	err := benchkit.Parallel(ctx, b.o.createParallel, len(pools), func(k int) error {
		p := pools[k]
		pool := poolOf(p.Leader)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.ElectionName(pool), Namespace: record.Namespace}}
		if err := record.SetElection(cm, record.Election{HolderIdentity: edgeName(p.Leader),
			LeaseDurationSeconds: 3600, AcquireTime: now, RenewTime: now}); err != nil {
			return err
		}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("election record of %s: %w", pool, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var members []int
	for _, p := range pools {
		members = append(members, p.Members...)
	}
	leases := b.admin.CoordinationV1().Leases(leaseNamespace)
	old := metav1.NewMicroTime(time.Now().Add(-time.Minute))
	return benchkit.Parallel(ctx, b.o.createParallel, len(members), func(k int) error {
		name := edgeName(members[k])
		secs := int32(40)
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: leaseNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &secs, RenewTime: &old}}
		if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("lease of %s: %w", name, err)
		}
		return nil
	})
}

// watchLeases calls f with every Lease update in kube-node-lease after
// resourceVersion rv, and the moment it arrived, until ctx ends (watching
// again from the last version seen if the server ends a watch).
func (b *bench) watchLeases(ctx context.Context, rv string, f func(*coordinationv1.Lease, time.Time)) error {
	leases := b.admin.CoordinationV1().Leases(leaseNamespace)
	for ctx.Err() == nil {
		w, err := leases.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("watch leases: %w", err)
		}
		for ev := range w.ResultChan() {
			seen := time.Now()
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				continue
			}
			rv = l.ResourceVersion
			if ev.Type == watch.Modified {
				f(l, seen)
			}
		}
		w.Stop()
	}
	return ctx.Err()
}

// waitCount waits until g has want edges registered.
func (b *bench) waitCount(ctx context.Context, g *gwProc, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		n, err := registered(ctx, g.host)
		if err == nil && n == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s has %d edges registered, not %d, after %v (%v)", g.host.Label, n, want, timeout, err)
		}
		if err := benchkit.Sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}
