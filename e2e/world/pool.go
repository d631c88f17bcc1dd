package world

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/testenv"
)

// ApplyEdgeRBAC applies what the edges need in the cloud beyond the Node
// authorizer: edge-rbac.yaml and the pool election's pool-rbac.yaml.
func (w *World) ApplyEdgeRBAC(t testenv.T) {
	t.Helper()
	w.ApplyShipped(t, "edge-rbac.yaml", "pool-rbac.yaml")
}

// ApplyShipped applies the shipped manifests of packaging/kubernetes
// named by files, as an operator does.
func (w *World) ApplyShipped(t testenv.T, files ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := filepath.Join(RepoRoot(), "packaging", "kubernetes")
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = filepath.Join(dir, f)
	}
	if err := testenv.ApplyManifests(ctx, w.CP.Admin, false, paths...); err != nil {
		t.Fatalf("apply the shipped manifests %v: %v", files, err)
	}
}

// ProxyArgs are the flags that make an edge the apiserver of its node's
// components (and a member of its node pool, which the Node's label
// names): the cloud apiserver, its CA (also the nodes' client CA, which
// verifies the pool's peers) and a data directory of its own.
func (w *World) ProxyArgs(e *Edge) []string {
	return []string{
		"--server-addr", w.CP.URL,
		"--server-ca", w.Path("cluster-ca.crt"),
		"--data-dir", w.Path(e.Name + "-data"),
		"--health-check-interval", "1s",
		"--unhealthy-threshold", "2",
	}
}

// Status reads e's /status.
func (e *Edge) Status(ctx context.Context) (statusapi.Edge, error) {
	var st statusapi.Edge
	body, err := Get(ctx, e.Host, EdgeAdmin("/status"))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		return st, fmt.Errorf("status of %s: %w", e.Name, err)
	}
	return st, nil
}

// QueueLedger reads the ledger of e's queue of status writes from its
// /status: every write queued since its cache file was made, across
// kills, and what became of it.
func (e *Edge) QueueLedger(ctx context.Context) (*statusapi.QueueLedger, error) {
	st, err := e.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("tether-edge's /status: %w", err)
	}
	if st.APIServer == nil || st.APIServer.QueueLedger == nil {
		return nil, fmt.Errorf("tether-edge's /status of %s has no queue ledger (apiserver.queueLedger)", e.Name)
	}
	return st.APIServer.QueueLedger, nil
}

// ProxyClient is a clientset that reaches the cloud through e's apiserver
// proxy, as the node component userAgent ("kubelet/v1.36.3", ...).
func (e *Edge) ProxyClient(userAgent string) kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(&rest.Config{Host: "http://127.0.0.1:10261", UserAgent: userAgent,
		Dial: e.Host.DialContext, QPS: 50, Burst: 100, Timeout: 10 * time.Second})
}

// hostCutTable keeps a host on its LAN only: everything to or from
// outside its site's LAN is dropped, in the host's own namespace.
const hostCutTable = "tether_test_uplink_cut"

// CutUplink cuts e's host off everything beyond its site's LAN (the
// cloud, the gateways), leaving its pool peers reachable.
func (e *Edge) CutUplink(t testenv.T) {
	t.Helper()
	lan := e.Site.LAN.String()
	rules := fmt.Sprintf(`table inet %s {
	chain in { type filter hook input priority -300; ip saddr != %s ip saddr != 127.0.0.0/8 drop; }
	chain out { type filter hook output priority -300; ip daddr != %s ip daddr != 127.0.0.0/8 drop; }
}`, hostCutTable, lan, lan)
	e.Host.Run(t, "nft", rules)
}

// HealUplink ends CutUplink.
func (e *Edge) HealUplink(t testenv.T) {
	t.Helper()
	e.Host.Run(t, "nft", "delete", "table", "inet", hostCutTable)
}

// Heartbeats renews the node Lease of e through its apiserver proxy every
// period, as kubelet's lease controller does (User-Agent kubelet; on a
// failed update the next try reads the Lease again), until ctx ends.
type Heartbeats struct {
	mu      sync.Mutex
	renewed int
	lastErr error
}

// StartHeartbeats starts renewing e's Lease.
func (e *Edge) StartHeartbeats(ctx context.Context, period time.Duration) *Heartbeats {
	hb := &Heartbeats{}
	c := e.ProxyClient("kubelet/v1.36.3 (linux/amd64) kubernetes/e2e")
	leases := c.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	go func() {
		var last *coordinationv1.Lease
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			err := func() error {
				if last == nil {
					l, err := leases.Get(ctx, e.Name, metav1.GetOptions{})
					if apierrors.IsNotFound(err) {
						l, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: e.Name},
							Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(e.Name), LeaseDurationSeconds: ptr.To[int32](40),
								RenewTime: &metav1.MicroTime{Time: time.Now()}}}, metav1.CreateOptions{})
					}
					if err != nil {
						return err
					}
					last = l
				}
				l := last.DeepCopy()
				l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
				l.Spec.HolderIdentity = ptr.To(e.Name)
				l.Spec.LeaseDurationSeconds = ptr.To[int32](40)
				up, err := leases.Update(ctx, l, metav1.UpdateOptions{})
				if err != nil {
					last = nil
					return err
				}
				last = up
				return nil
			}()
			hb.mu.Lock()
			if err == nil {
				hb.renewed++
			}
			hb.lastErr = err
			hb.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return hb
}

// Renewed is the number of renewals that succeeded, and the last error.
func (hb *Heartbeats) Renewed() (int, error) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.renewed, hb.lastErr
}
