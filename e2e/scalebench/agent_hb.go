package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
)

// hbRequest asks the agent to play pool leaders renewing the Leases of
// their offline members through the gateway (delegated heartbeats), as
// tether-edge's pool leader does: every Interval for Duration, each member
// at its own random phase in the interval.
type hbRequest struct {
	Pools    []hbPool      `json:"pools"`
	Interval time.Duration `json:"interval"`
	Duration time.Duration `json:"duration"`
}

type hbPool struct {
	Leader  int   `json:"leader"`
	Members []int `json:"members"`
}

// hbResult counts the renewals sent. Every renewal's spec.renewTime is the
// moment the leader sent it, which the parent compares with the moment it
// sees the Lease updated.
type hbResult struct {
	Sent     int64            `json:"sent"`
	OK       int64            `json:"ok"`
	Errors   map[string]int64 `json:"errors"` // by refusal code, or "error"
	FirstErr string           `json:"firstErr,omitempty"`
	ReplyP50 time.Duration    `json:"replyP50"` // send → the gateway's reply
	ReplyP99 time.Duration    `json:"replyP99"`
}

func (a *agent) heartbeats(ctx context.Context, req hbRequest) (hbResult, error) {
	if req.Interval <= 0 || req.Duration <= 0 {
		return hbResult{}, errors.New("interval and duration must be positive")
	}
	leaders := map[int]*edgetunnel.Client{}
	a.mu.Lock()
	for _, p := range req.Pools {
		if p.Leader < 1 || p.Leader > len(a.edges) || a.edges[p.Leader-1].client == nil {
			a.mu.Unlock()
			return hbResult{}, fmt.Errorf("leader edge %d is not running", p.Leader)
		}
		leaders[p.Leader] = a.edges[p.Leader-1].client
	}
	a.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, req.Duration)
	defer cancel()
	var mu sync.Mutex
	res := hbResult{Errors: map[string]int64{}}
	var lat []time.Duration
	var wg sync.WaitGroup
	for _, p := range req.Pools {
		leader := leaders[p.Leader]
		for _, m := range p.Members {
			wg.Add(1)
			go func() {
				defer wg.Done()
				node := edgeName(m)
				next := time.Now().Add(rand.N(req.Interval))
				for {
					t := time.NewTimer(time.Until(next))
					select {
					case <-ctx.Done():
						t.Stop()
						return
					case <-t.C:
					}
					next = next.Add(req.Interval)
					sent := time.Now()
					lease, err := leaseJSON(node, sent)
					if err == nil {
						// Its own bound, not ctx: a renewal sent just
						// before the end still gets its answer.
						sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
						err = leader.DelegateHeartbeat(sctx, node, lease)
						scancel()
					}
					took := time.Since(sent)
					mu.Lock()
					res.Sent++
					if err == nil {
						res.OK++
						lat = append(lat, took)
					} else {
						key := "error"
						var dr *edgetunnel.DelegateRefusedError
						if errors.As(err, &dr) {
							key = dr.Code.String()
						}
						res.Errors[key]++
						if res.FirstErr == "" {
							res.FirstErr = err.Error()
						}
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	slices.Sort(lat)
	res.ReplyP50, res.ReplyP99 = benchkit.Pct(lat, 50), benchkit.Pct(lat, 99)
	return res, nil
}

// leaseJSON is node's Lease as its kubelet renews it, renewed at t.
func leaseJSON(node string, t time.Time) ([]byte, error) {
	secs := int32(40)
	return json.Marshal(coordinationv1.Lease{
		TypeMeta:   metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: leaseNamespace},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &node,
			LeaseDurationSeconds: &secs,
			RenewTime:            &metav1.MicroTime{Time: t},
		},
	})
}

const leaseNamespace = "kube-node-lease"
