package poolstore

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tether-edge/tether/poolstore/replica"
)

// BenchmarkReplicationLag applies b.N EndpointSlice changes on the leader
// and reports the time until the follower's store has each one, p50 and
// p99 in milliseconds: in a burst (as fast as the leader takes them, so
// the lag is mostly queueing: the follower decodes and applies each
// change as the leader did, on the same cores), and paced at one change
// a millisecond (the latency of one change).
func BenchmarkReplicationLag(b *testing.B) {
	b.Run("burst", func(b *testing.B) { benchmarkLag(b, 0) })
	b.Run("paced-1ms", func(b *testing.B) { benchmarkLag(b, time.Millisecond) })
}

func benchmarkLag(b *testing.B, pace time.Duration) {
	c := newCluster(b)
	l, f := c.addNode("l", "a"), c.addNode("f", "a")
	l.lead("l/1")
	if err := l.store.Replace(slices_, nil, 1); err != nil {
		b.Fatal(err)
	}
	converged(b, l, f)
	base := l.store.Rev()

	// The follower side: when each revision arrived (two per change: the
	// change and the attestation that closes it).
	arrived := make([]time.Time, 2*b.N)
	var wg sync.WaitGroup
	wg.Go(func() {
		end := base + uint64(2*b.N)
		for seen := base; ; {
			ch := f.store.Changed()
			rev, now := f.store.Rev(), time.Now()
			for ; seen < rev && seen < end; seen++ {
				arrived[seen-base] = now
			}
			if seen == end {
				return
			}
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				b.Errorf("follower stuck at revision %d of %d", rev, end)
				return
			}
		}
	})

	applied := make([]time.Time, b.N)
	objs := make([]json.RawMessage, b.N)
	for i := range objs {
		objs[i] = endpointSlice(i)
	}
	var tick <-chan time.Time
	if pace > 0 {
		t := time.NewTicker(pace)
		defer t.Stop()
		tick = t.C
	}
	b.ResetTimer()
	for i := range b.N {
		if tick != nil {
			<-tick
		}
		applied[i] = time.Now()
		if err := l.store.Apply(slices_, replica.Added, objs[i]); err != nil {
			b.Fatal(err)
		}
		c.attest(l) // a unit of the gateway's feed per change
	}
	wg.Wait()
	b.StopTimer()

	lags := make([]time.Duration, b.N)
	for i := range lags {
		lags[i] = arrived[2*i+1].Sub(applied[i]) // committed with its attestation
	}
	slices.Sort(lags)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(lags[len(lags)/2]), "p50-ms")
	b.ReportMetric(ms(lags[len(lags)*99/100]), "p99-ms")
}

// endpointSlice is a small EndpointSlice of a Service, i-th of its kind.
func endpointSlice(i int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1",`+
		`"metadata":{"namespace":"default","name":"svc-%d-abcde","resourceVersion":"%d",`+
		`"labels":{"kubernetes.io/service-name":"svc-%d","endpointslice.kubernetes.io/managed-by":"endpointslice-controller.k8s.io"}},`+
		`"addressType":"IPv4","endpoints":[{"addresses":["10.0.%d.%d"],"conditions":{"ready":true},"nodeName":"node-%d"}],`+
		`"ports":[{"name":"http","protocol":"TCP","port":8080}]}`, i, i+2, i, i/250%250, i%250+1, i%10))
}
