// Package heartbeat writes the Lease renewals a pool's leader sends
// through its tunnel on behalf of pool members that lost the cloud
// (delegated heartbeats). No node identity may write another node's Lease;
// the gateway does, with its own credentials, after checking that the
// sender may ask:
//
//  1. the Lease is a Lease kube-node-lease/<delegated node> (an empty
//     namespace stands for kube-node-lease) with a spec.renewTime (else
//     tunnel.BadLease);
//  2. the sender, named by its verified client certificate and never by
//     the request, and the delegated node both have a Node (UnknownNode)
//     with a pool label (NotInPool), the same one (OtherPool);
//  3. the sender holds that pool's election record,
//     tether-system/pool-<pool> as record.ReadLeader reads it
//     (NotLeader), and it has not expired: renewTime +
//     leaseDurationSeconds, at most Options.MaxLease (the pools'
//     configured lease), is after now (LeaderExpired). The record is a
//     ConfigMap, not a Lease: NodeRestriction lets a node identity write
//     no Lease outside kube-node-lease (see poolstore).
//
// Then the delegated node's Lease is updated (created if missing):
// spec.renewTime, and holderIdentity when the sent Lease has it, come
// from the sent Lease (leaseDurationSeconds too, at most 40 s, for a
// Lease that has none: a kubelet's stays as it wrote it), and the annotation
// openyurt.io/delegate-heartbeat is "true". The rest of the object is the
// cluster's: nothing else the edge sent is written. A renewal no newer
// than the Lease's own is answered OK without a write, so that a request
// retried on another replica, or overtaken by the node's own renewal,
// never moves renewTime back.
//
// In the steady state a renewal costs one request: the Lease is read from
// Options.Leases (the gateway's informer on kube-node-lease, shared with
// pooltaint; its objects lack only managedFields) and the update is a
// copy of it, with its resourceVersion, so that a stale copy is refused
// with a conflict. A conflict (the cache was behind: the node renewed
// itself, another replica wrote) or a Lease missing from the cache falls
// back to a GET, and the decision is made again from what it read
// (retried up to retry.DefaultRetry's steps). Such reads are counted in
// tether_gateway_delegated_heartbeat_lease_reads_total by reason.
//
// Renewals have their own request budget (Options.Requests, in the
// gateway sized by --kube-api-qps and --kube-api-burst, beside the
// client's own for every other request): every request a renewal sends
// takes a token first, and a renewal that would wait longer than
// Options.MaxWait for one is answered Unavailable at once, without a
// request (counted in tether_gateway_delegated_heartbeats_throttled_total
// and as unavailable), rather than queueing past its leader's deadline.
//
// Times are the gateway's: a sent renewTime later than the gateway's
// clock is written as the gateway's now (reason "sent_in_future"), so
// that a leader cannot keep a member looking alive for a day with one
// renewal; and a stored renewTime later than the gateway's clock (written
// by the node itself, or before this check) does not count as newer, so
// that it cannot make every honest renewal after it look old
// ("stored_in_future"). Both are counted in
// tether_gateway_delegated_heartbeats_clamped_total by reason, and
// logged.
//
// The election record is read from Options.Records: in the gateway a
// poolcheck.RecordCache, an informer, so that no check costs a request to
// the apiserver; a record the informer has not synced is Unavailable.
//
// A sender refused too often is not looked at: every refusal but
// Unavailable takes a token of the sender's bucket (poolcheck.Limiter,
// Options.Limit: 20 in a row, given back over a minute), and a sender with
// none left is answered tunnel.RateLimited, before any check and without
// a request to the apiserver, until a token is back; logged once when it
// runs out, not for every request.
//
// Every answer is counted in tether_gateway_delegated_heartbeats_total by
// result (ok, rate_limited or the refusal's code) and every other refusal
// is logged with the node, the sender and the reason. Nothing is written
// on a refusal.
package heartbeat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/gateway/poolcheck"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// Options configure New.
type Options struct {
	// Client writes the node Leases and reads the election records with
	// the gateway's identity. Required.
	Client kubernetes.Interface
	// Nodes tells the nodes' pools; nil means poolcheck.APINodes{Client}.
	Nodes poolcheck.NodePools
	// Records reads the election records (a poolcheck.RecordCache); nil
	// means a GET with Client for every check.
	Records record.ConfigMapGetter
	// Leases is an informer on the Leases of kube-node-lease (such as
	// pooltaint.NewLeaseInformer's), which the caller runs: a Lease in its
	// store is updated from a copy of it, without a GET, so its objects
	// must be whole but for managedFields. Nil means a GET before every
	// write.
	Leases cache.SharedInformer
	// Requests is the renewals' budget of apiserver requests: each
	// request takes a token. Nil means no limit (Client's own still
	// applies).
	Requests *rate.Limiter
	// MaxWait is the longest a renewal waits for a token of Requests
	// before it is answered Unavailable; zero means DefaultMaxWait.
	MaxWait time.Duration
	// Limit is how many refusals a sender may draw before it is answered
	// tunnel.RateLimited; zero means poolcheck.DefaultLimit.
	Limit poolcheck.Limit
	// MaxLease bounds the lease of a pool's election record in the leader
	// check (poolcheck.Checker.MaxLease): the gateway's
	// --pool-lease-duration; zero means record.DefaultLeaseDuration.
	MaxLease time.Duration
	// Clock decides whether an election record has expired, is the
	// latest renewTime written, and gives back the refused senders'
	// tokens; nil means the real clock.
	Clock clock.PassiveClock
	// Logger receives refusals (warn) and writes (debug); nil discards.
	Logger *slog.Logger
	// Registerer, if set, gets the handler's metrics (metrics.go).
	Registerer prometheus.Registerer
}

// Handler answers delegated heartbeats; it implements the tunnel server's
// Heartbeats.
type Handler struct {
	client   kubernetes.Interface
	leases   cache.SharedInformer // nil: no cache
	requests *rate.Limiter        // nil: no budget
	maxWait  time.Duration
	check    poolcheck.Checker
	limit    *poolcheck.Limiter
	clock    clock.PassiveClock
	log      *slog.Logger
	*metrics

	// throttledLogged is when a throttled renewal was last logged (unix
	// nanoseconds): at most one line a minute.
	throttledLogged atomic.Int64
}

// DefaultMaxWait is how long a renewal may wait for a request token: well
// within a leader's deadline (5 s), and long enough to ride out a burst.
const DefaultMaxWait = time.Second

// Why a Lease was read with a GET, the "reason" label of
// tether_gateway_delegated_heartbeat_lease_reads_total.
const (
	readNotCached = "not_cached" // not in the informer's store (yet)
	readConflict  = "conflict"   // the write's resourceVersion was stale, or the Lease gone
)

// Why a renewTime was not taken as it came, the "reason" label of
// tether_gateway_delegated_heartbeats_clamped_total.
const (
	clampedSent   = "sent_in_future"   // the sent renewTime, written as now
	clampedStored = "stored_in_future" // the Lease's, not counted as newer
)

// New returns a Handler.
func New(o Options) (*Handler, error) {
	if o.Client == nil {
		return nil, errors.New("delegated heartbeats: no Kubernetes client")
	}
	nodes := o.Nodes
	if nodes == nil {
		nodes = poolcheck.APINodes{Client: o.Client}
	}
	records := o.Records
	if records == nil {
		records = o.Client.CoreV1().ConfigMaps(record.Namespace)
	}
	h := &Handler{client: o.Client, leases: o.Leases, requests: o.Requests, maxWait: o.MaxWait, clock: o.Clock, log: o.Logger,
		check: poolcheck.Checker{Nodes: nodes, Records: records, MaxLease: o.MaxLease},
	}
	if h.maxWait <= 0 {
		h.maxWait = DefaultMaxWait
	}
	if h.clock == nil {
		h.clock = clock.RealClock{}
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.limit = poolcheck.NewLimiter(o.Limit, h.clock)
	var err error
	if h.metrics, err = newMetrics(o.Registerer); err != nil {
		return nil, fmt.Errorf("register delegated heartbeat metrics: %w", err)
	}
	return h, nil
}

// Delegate checks req from sender and writes its Lease (see the package
// doc).
func (h *Handler) Delegate(ctx context.Context, sender string, req tunnel.DelegateRequest) tunnel.Reply {
	if err := h.limit.Allow(sender); err != nil {
		r := poolcheck.AsRefusal(err)
		h.result(r.Code)
		h.log.Debug("delegated heartbeat refused", "node", req.Node, "sender", sender, "reason", r.Code.String(), "err", r.Msg)
		return tunnel.Reply{Code: r.Code, Message: r.Msg}
	}
	pool, written, err := h.delegate(ctx, sender, req)
	if r := poolcheck.AsRefusal(err); r != nil {
		h.result(r.Code)
		h.log.Warn("delegated heartbeat refused", "node", req.Node, "sender", sender, "pool", pool, "reason", r.Code.String(), "err", r.Msg)
		if h.limit.Refused(sender, r.Code) {
			h.log.Warn("sender refused too often: its delegated heartbeats are answered rate_limited for a while", "sender", sender, "pool", pool)
		}
		return tunnel.Reply{Code: r.Code, Message: r.Msg}
	}
	h.result(tunnel.OK)
	h.log.Debug("delegated heartbeat", "node", req.Node, "sender", sender, "pool", pool, "written", written)
	return tunnel.Reply{Code: tunnel.OK}
}

// delegate returns the pool (once known) and whether the Lease was
// written; the error is a *poolcheck.Refusal, or an apiserver error.
func (h *Handler) delegate(ctx context.Context, sender string, req tunnel.DelegateRequest) (pool string, written bool, _ error) {
	sent, err := parseLease(req)
	if err != nil {
		return "", false, err
	}
	if pool, err = h.check.PoolOf(ctx, sender, "sender"); err != nil {
		return "", false, err
	}
	nodePool, err := h.check.PoolOf(ctx, req.Node, "delegated node")
	if err != nil {
		return pool, false, err
	}
	if nodePool != pool {
		return pool, false, poolcheck.Refuse(tunnel.OtherPool, "node %s is in pool %q, sender %s in pool %q", req.Node, nodePool, sender, pool)
	}
	if err := h.check.Leader(ctx, sender, pool, h.clock.Now()); err != nil {
		return pool, false, err
	}
	written, err = h.write(ctx, sender, sent)
	return pool, written, err
}

// parseLease decodes the sent Lease and checks that it is the delegated
// node's.
func parseLease(req tunnel.DelegateRequest) (*coordinationv1.Lease, error) {
	var l coordinationv1.Lease
	if err := json.Unmarshal(req.Lease, &l); err != nil {
		return nil, poolcheck.Refuse(tunnel.BadLease, "not a Lease: %v", err)
	}
	if (l.APIVersion != "" && l.APIVersion != coordinationv1.SchemeGroupVersion.String()) || (l.Kind != "" && l.Kind != "Lease") {
		return nil, poolcheck.Refuse(tunnel.BadLease, "a %s %s, not a Lease", l.APIVersion, l.Kind)
	}
	if (l.Namespace != "" && l.Namespace != corev1.NamespaceNodeLease) || l.Name != req.Node {
		return nil, poolcheck.Refuse(tunnel.BadLease, "Lease %s/%s is not %s/%s", l.Namespace, l.Name, corev1.NamespaceNodeLease, req.Node)
	}
	l.Namespace = corev1.NamespaceNodeLease
	if l.Spec.RenewTime == nil {
		return nil, poolcheck.Refuse(tunnel.BadLease, "Lease %s/%s has no spec.renewTime", l.Namespace, l.Name)
	}
	return &l, nil
}

// write updates (or creates) the delegated node's Lease from sent and
// reports whether it wrote: a Lease already renewed at or after sent's
// renewTime is left alone. Times are clamped to the gateway's clock (see
// the package doc). The Lease is the informer's copy if it has one, else
// (and after a conflict) a GET's.
func (h *Handler) write(ctx context.Context, sender string, sent *coordinationv1.Lease) (bool, error) {
	now := metav1.NewMicroTime(h.clock.Now())
	if sent.Spec.RenewTime.After(now.Time) {
		h.clamped.WithLabelValues(clampedSent).Inc()
		h.log.Warn("delegated heartbeat from the future: written as the gateway's now", "node", sent.Name, "sender", sender,
			"renew_time", sent.Spec.RenewTime.UTC().Format(time.RFC3339Nano), "now", now.UTC().Format(time.RFC3339Nano))
		sent.Spec.RenewTime = &now
	}
	leases := h.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	written := false
	var storedAhead *metav1.MicroTime // the Lease's renewTime, when later than now
	cur, readReason := h.cached(sent.Name), readNotCached
	retriable := func(err error) bool {
		return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)
	}
	err := retry.OnError(retry.DefaultRetry, retriable, func() error {
		if cur == nil {
			h.reads.WithLabelValues(readReason).Inc()
			if err := h.wait(ctx); err != nil {
				return err
			}
			var err error
			cur, err = leases.Get(ctx, sent.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				cur = nil
				l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: sent.Name, Namespace: corev1.NamespaceNodeLease}}
				apply(l, sent)
				if err := h.wait(ctx); err != nil {
					return err
				}
				if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
					if apierrors.IsNotFound(err) {
						return fmt.Errorf("create Lease: %v", err) // the namespace is missing: not retried
					}
					readReason = readConflict
					return err
				}
				written = true
				return nil
			}
			if err != nil {
				cur = nil
				return err
			}
		}
		storedAhead = nil
		if cur.Spec.RenewTime != nil && cur.Spec.RenewTime.After(now.Time) {
			storedAhead = cur.Spec.RenewTime
		} else if cur.Spec.RenewTime != nil && !cur.Spec.RenewTime.Before(sent.Spec.RenewTime) {
			return nil
		}
		l := cur.DeepCopy() // cur may be the informer's
		apply(l, sent)
		if err := h.wait(ctx); err != nil {
			return err
		}
		if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			cur, readReason = nil, readConflict // read again: a stale resourceVersion, or the Lease is gone
			return err
		}
		written = true
		return nil
	})
	if errors.Is(err, errThrottled) {
		h.throttled.Inc()
		if last := h.throttledLogged.Load(); time.Duration(now.UnixNano()-last) >= time.Minute && h.throttledLogged.CompareAndSwap(last, now.UnixNano()) {
			h.log.Warn("delegated heartbeats throttled: their apiserver request budget is spent; raise --kube-api-qps and --kube-api-burst (logged once a minute; see tether_gateway_delegated_heartbeats_throttled_total)",
				"node", sent.Name, "sender", sender, "max_wait", h.maxWait)
		}
	}
	if err != nil {
		return false, poolcheck.Refuse(tunnel.Unavailable, "write Lease %s/%s: %v", corev1.NamespaceNodeLease, sent.Name, err)
	}
	if written && storedAhead != nil {
		h.clamped.WithLabelValues(clampedStored).Inc()
		h.log.Warn("node Lease was renewed in the future: overwritten by a delegated heartbeat", "node", sent.Name, "sender", sender,
			"renew_time", storedAhead.UTC().Format(time.RFC3339Nano), "now", now.UTC().Format(time.RFC3339Nano))
	}
	return written, nil
}

// cached returns the informer's copy of node's Lease, or nil. The copy is
// shared: it is read, never changed.
func (h *Handler) cached(node string) *coordinationv1.Lease {
	if h.leases == nil {
		return nil
	}
	obj, ok, err := h.leases.GetStore().GetByKey(corev1.NamespaceNodeLease + "/" + node)
	if err != nil || !ok {
		return nil
	}
	l, _ := obj.(*coordinationv1.Lease)
	return l
}

// errThrottled is wait's answer when the budget has no token in time.
var errThrottled = errors.New("delegated heartbeats' apiserver request budget spent (--kube-api-qps, --kube-api-burst)")

// wait takes a token of the renewals' request budget, waiting up to
// maxWait (and not past ctx's deadline); errThrottled, at once, when it
// would have to wait longer.
func (h *Handler) wait(ctx context.Context) error {
	if h.requests == nil {
		return nil
	}
	r := h.requests.Reserve()
	d := r.Delay()
	if dl, ok := ctx.Deadline(); d > h.maxWait || (ok && time.Until(dl) < d) {
		r.Cancel()
		return errThrottled
	}
	if d == 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		r.Cancel()
		return context.Cause(ctx)
	}
}

// maxNodeLeaseSeconds bounds the leaseDurationSeconds a delegated
// heartbeat may give a Lease that has none: the kubelet's own (40 s).
const maxNodeLeaseSeconds = 40

// apply copies what a delegated heartbeat may change from sent into l.
// The Lease's leaseDurationSeconds is the one stored, which the node's
// kubelet wrote: the leader's is taken only for a Lease without one, and
// at most maxNodeLeaseSeconds.
func apply(l, sent *coordinationv1.Lease) {
	l.Spec.RenewTime = sent.Spec.RenewTime.DeepCopy()
	if sent.Spec.HolderIdentity != nil {
		l.Spec.HolderIdentity = new(*sent.Spec.HolderIdentity)
	}
	if l.Spec.LeaseDurationSeconds == nil && sent.Spec.LeaseDurationSeconds != nil && *sent.Spec.LeaseDurationSeconds > 0 {
		l.Spec.LeaseDurationSeconds = new(min(*sent.Spec.LeaseDurationSeconds, maxNodeLeaseSeconds))
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[openyurt.DelegateHeartbeatAnnotation] = "true"
}
