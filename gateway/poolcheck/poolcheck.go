// Package poolcheck decides who may ask the gateway, through its tunnel,
// on behalf of a node pool: the checks that the delegated heartbeats
// (gateway/heartbeat) and the election records (gateway/election) share.
//
// A sender is named by its verified client certificate, never by the
// request. Its pool is the value of the openyurt.PoolLabel on its Node
// (NodePools; tunnel.UnknownNode without a Node, tunnel.NotInPool without
// the label). It leads its pool if it holds the pool's election record,
// tether-system/pool-<pool> as record.ReadLeader reads it
// (tunnel.NotLeader), and the record has not expired at the caller's now:
// renewTime + leaseDurationSeconds is after it (tunnel.LeaderExpired),
// the duration counted at most MaxLease, the pool's configured lease (the
// holder writes leaseDurationSeconds: a huge one would otherwise keep a
// leader that stopped renewing for decades).
// An apiserver error is tunnel.Unavailable: another replica may do better.
//
// The gateway reads the records from a RecordCache, an informer on the
// ConfigMaps of tether-system (trimmed to the election annotation), so
// that a check costs no request to the apiserver; until it has synced the
// answer is tunnel.Unavailable, and the gateway is not ready. A record
// the informer has not seen yet (milliseconds after a write) reads as the
// one before: a new leader may be refused not_leader once and retry; an
// old one is still held to the old record's expiry.
//
// A Limiter keeps a token bucket of refusals per sender: a sender refused
// too often (DefaultLimit: 20 in a row, given back over a minute) is
// answered tunnel.RateLimited before any check, and so costs the
// apiserver nothing, until a token is back.
//
// Every check answers a *Refusal, which carries the tunnel.Code the edge
// gets back and the message it reads; the handlers count and log it.
package poolcheck

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// NodePools tells the pool of a node.
type NodePools interface {
	// NodePool returns the value of the node's openyurt.PoolLabel ("" when
	// it has none); found is false when there is no such Node.
	NodePool(ctx context.Context, node string) (pool string, found bool, err error)
}

// APINodes reads Nodes from the apiserver, one GET each.
type APINodes struct{ Client kubernetes.Interface }

var _ NodePools = APINodes{}

// NodePool implements NodePools.
func (a APINodes) NodePool(ctx context.Context, node string) (string, bool, error) {
	n, err := a.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("get node %s: %w", node, err)
	}
	return n.Labels[openyurt.PoolLabel], true, nil
}

// Refusal is why a request was not carried out: the code and the message
// the edge gets back.
type Refusal struct {
	Code tunnel.Code
	Msg  string
}

func (r *Refusal) Error() string { return r.Code.String() + ": " + r.Msg }

// Refuse returns a Refusal of code with a formatted message.
func Refuse(code tunnel.Code, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// AsRefusal returns the Refusal err is or wraps, err as a
// tunnel.Unavailable Refusal if it is none, and nil if err is nil.
func AsRefusal(err error) *Refusal {
	var r *Refusal
	if err != nil && !errors.As(err, &r) {
		r = Refuse(tunnel.Unavailable, "%v", err)
	}
	return r
}

// Checker checks senders against the nodes' pools and the pools'
// election records.
type Checker struct {
	// Nodes tells the nodes' pools.
	Nodes NodePools
	// Records reads the ConfigMaps of record.Namespace, where the
	// election records are.
	Records record.ConfigMapGetter
	// MaxLease bounds a record's lease duration (record.Election.Lease):
	// the gateway's --pool-lease-duration, which equals the edges'; zero
	// means record.DefaultLeaseDuration.
	MaxLease time.Duration
}

// PoolOf returns node's pool, or a Refusal if it has none. role, if not
// empty, names the node in the messages ("sender", "delegated node").
func (c Checker) PoolOf(ctx context.Context, node, role string) (string, error) {
	who := node
	if role != "" {
		who = role + " " + node
	}
	pool, found, err := c.Nodes.NodePool(ctx, node)
	switch {
	case err != nil:
		return "", Refuse(tunnel.Unavailable, "pool of %s: %v", who, err)
	case !found:
		return "", Refuse(tunnel.UnknownNode, "%s has no Node", who)
	case pool == "":
		return "", Refuse(tunnel.NotInPool, "%s has no %s label", who, openyurt.PoolLabel)
	}
	return pool, nil
}

// Member refuses unless node's Node is in pool.
func (c Checker) Member(ctx context.Context, node, pool string) error {
	got, err := c.PoolOf(ctx, node, "")
	if err != nil {
		return err
	}
	if got != pool {
		return Refuse(tunnel.OtherPool, "%s is in pool %q, not %q", node, got, pool)
	}
	return nil
}

// Leader refuses unless sender holds pool's election record, unexpired
// at now, read from the caller's clock, its lease counted at most
// MaxLease.
func (c Checker) Leader(ctx context.Context, sender, pool string, now time.Time) error {
	ref := record.Namespace + "/" + record.ElectionName(pool)
	el, err := record.ReadLeader(ctx, c.Records, pool)
	maxLease := c.MaxLease
	if maxLease <= 0 {
		maxLease = record.DefaultLeaseDuration
	}
	expires := el.Expires(maxLease)
	switch {
	case apierrors.IsNotFound(err):
		return Refuse(tunnel.NotLeader, "pool %s has no leader (election record %s)", pool, ref)
	case err != nil:
		return Refuse(tunnel.Unavailable, "read election record %s: %v", ref, err)
	case el.Holder != sender:
		return Refuse(tunnel.NotLeader, "pool %s is led by %s, not %s (election record %s)", pool, el.Holder, sender, ref)
	case !now.Before(expires):
		return Refuse(tunnel.LeaderExpired, "election record %s expired at %s (now %s)", ref,
			expires.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano))
	}
	return nil
}
