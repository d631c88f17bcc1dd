package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// TestLeaseHeldForever: a stolen node key writes its pool's election
// record through its own tunnel naming itself, with a lease of 3e9 seconds
// (95 years), and stops renewing. Promise (SECURITY.md): it loses the lead
// within the pool's configured lease (15 s), whatever the record says. The
// record is stored with at most that lease; the gateway refuses the
// thief's delegated heartbeats leader_expired once it has passed; an
// honest member that comes up takes the lead within it (plus its election
// retries). With real binaries, the shipped manifests and a real
// kube-apiserver.
func TestLeaseHeldForever(t *testing.T) {
	testenv.RequireRoot(t)
	w := world.New(t, bins, world.Options{Sites: []testenv.SiteSpec{
		{Name: "site-x", Hosts: []string{"edge-0", "edge-1"}, LAN: netip.MustParsePrefix("192.168.9.0/24")},
	}}, t.Logf)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w.ApplyShipped(t, "edge-rbac.yaml", "pool-rbac.yaml", "node-admission.yaml")
	gw := w.Gateways[0]
	w.StartGateway(t, gw, "--netrules", "nftables")
	for _, e := range w.Edges {
		w.StartEdge(t, e, w.ProxyArgs(e)...)
	}
	thief, honest := w.Edge("edge-0"), w.Edge("edge-1")
	waitOneLeader(t, ctx, w.Edges, nil, 60*time.Second)

	// The honest member loses power; the thief's tether-edge is replaced
	// by the attacker's own client, holding the node's key.
	w.Kill(honest.Host) // its error is the SIGKILL's exit status
	if err := w.Stop(thief.Host); err != nil {
		t.Logf("stop the thief's tether-edge: %v", err)
	}
	kp, err := w.ClusterCA.NodeCert(thief.Name)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := dialTunnel(ctx, thief.Host, gw, kp.TLS, w.GatewayCA.Pool())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(tunnel.CloseNormal, "")

	cms := w.CP.Client.CoreV1().ConfigMaps(record.Namespace)
	name := record.ElectionName("site-x")
	var took time.Time
	testenv.EventuallyNoError(t, "the thief to take its pool's record with a lease of 3e9 s", func() error {
		cur, err := cms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		old, err := record.DecodeElection(cur)
		if err != nil {
			return err
		}
		now := metav1.Now()
		if err := record.SetElection(cur, record.Election{HolderIdentity: thief.Name, LeaseDurationSeconds: 3000000000,
			AcquireTime: now, RenewTime: now, LeaderTransitions: old.LeaderTransitions + 1}); err != nil {
			return err
		}
		b, _ := json.Marshal(cur)
		took = time.Now()
		if rep := electionRequest(t, ctx, conn, tunnel.ElectionRequest{Op: tunnel.ElectionUpdate, Record: tunnel.RecordElection,
			Pool: "site-x", ConfigMap: b}); rep.Code != tunnel.OK {
			return fmt.Errorf("%v: %s", rep.Code, rep.Message)
		}
		return nil
	})
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := record.DecodeElection(cm)
	if err != nil || stored.HolderIdentity != thief.Name {
		t.Fatalf("stored record %+v, %v; want the thief's", stored, err)
	}
	if stored.LeaseDurationSeconds > 15 {
		t.Errorf("stored leaseDurationSeconds %d, want at most the pool's 15", stored.LeaseDurationSeconds)
	}

	// As its pool's leader, the thief may renew its member's Lease; once
	// the pool's lease has passed without a renewal, no longer.
	heartbeat := func() tunnel.Reply {
		lease, _ := json.Marshal(coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: honest.Name, Namespace: corev1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: time.Now()}}})
		return delegateRequest(t, ctx, conn, tunnel.DelegateRequest{Node: honest.Name, Lease: lease})
	}
	if rep := heartbeat(); rep.Code != tunnel.OK {
		t.Fatalf("the leader's delegated heartbeat right after its renewal: %v %s", rep.Code, rep.Message)
	}
	testenv.EventuallyWithin(t, 45*time.Second, "the gateway to refuse the thief's delegated heartbeat leader_expired", func() bool {
		return heartbeat().Code == tunnel.LeaderExpired
	})
	refused := time.Since(took)
	t.Logf("the thief's delegated heartbeat refused leader_expired %v after its last renewal", refused.Round(time.Millisecond))
	if refused > 15*time.Second+5*time.Second {
		t.Errorf("refused %v after the last renewal, want within the pool's 15 s lease (and 5 s of slack)", refused.Round(time.Millisecond))
	}

	// The honest member comes back: it sees the record unchanged for the
	// pool's lease and takes it, at its next try (retries every 2 s to
	// 2.2 s), whatever lease the thief wrote.
	restarted := time.Now()
	w.StartEdge(t, honest, w.ProxyArgs(honest)...)
	testenv.EventuallyWithin(t, 60*time.Second, "the honest member to take the thief's record", func() bool {
		el, err := record.ReadLeader(ctx, cms, "site-x")
		return err == nil && el.Holder == honest.Name
	})
	took2 := time.Since(restarted)
	t.Logf("the honest member leads %v after its start", took2.Round(time.Millisecond))
	if bound := 15*time.Second + 2*2200*time.Millisecond + 15*time.Second; took2 > bound {
		t.Errorf("the honest member led %v after its start, want within %v (lease, two retries, start)", took2.Round(time.Millisecond), bound)
	}
	waitOneLeader(t, ctx, []*world.Edge{honest}, nil, 30*time.Second)
}
