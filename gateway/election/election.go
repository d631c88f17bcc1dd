// Package election writes the records of the node pools' leader
// elections on behalf of the edges, which may only read them.
//
// A pool's election record is the ConfigMap tether-system/pool-<pool>
// (record.ElectionName; client-go's leader record in its annotation), and
// its leader's sync mark tether-system/pool-<pool>-sync
// (record.SyncName; holder and renewTime in its data). They are
// ConfigMaps because NodeRestriction lets a node identity write no Lease
// but its own. If nodes wrote them, any node could write any pool's: RBAC
// cannot tell the pools' ConfigMaps apart (create cannot be limited by
// name, and pools come and go), and a ValidatingAdmissionPolicy cannot
// either, for CEL has no lookups and so cannot know the requesting node's
// pool. So nodes only read them (packaging/kubernetes/pool-rbac.yaml), and
// an edge campaigns through its tunnel: it sends the record it would
// write (tunnel.ElectionRequest) and the gateway, trusted already and
// reached by every edge, writes it with its own RBAC once it has checked
// that the sender may:
//
//  1. the sender, named by its verified client certificate and never by
//     the request, has a Node (else tunnel.UnknownNode) with a pool label
//     (NotInPool) equal to the request's pool (OtherPool). The label is
//     trusted: an admission policy keeps nodes from changing it;
//  2. the ConfigMap is the pool's record of the kind asked, by name:
//     tether-system/pool-<pool> for the election record,
//     tether-system/pool-<pool>-sync for the sync record, nothing else
//     (BadRecord); it holds a well-formed record (BadRecord), and an
//     update names the resourceVersion it is based on (BadRecord);
//  3. the election record names the sender as holder (else NotHolder), or
//     releases (no holder) a record that names the sender now (NotLeader;
//     the current record is read); the sync record names the sender
//     (NotHolder), and the sender holds the pool's election record
//     (NotLeader), unexpired by the gateway's clock (LeaderExpired).
//
// Then the record's times are clamped to the gateway's clock (renewTime
// and acquireTime no later than now), so that a node cannot write a
// renewal from the future, and its leaseDurationSeconds to the pools'
// configured lease (Options.MaxLease; record.SyncLeaseSeconds for a sync
// record), so that a node cannot write a lead that outlasts it; every
// reader bounds it too (record.Election.Lease). The record is written: created as a
// ConfigMap of that name holding the record and nothing else, or updated
// on the object the cluster holds, of which only the record (the election
// annotation, or the sync record's three data keys) changes, with the
// resourceVersion the edge sent, so that optimistic concurrency still
// decides between candidates: a write based on an older version (or a
// create of an existing record, or an update of a deleted one) is
// answered Conflict, and the edge's elector reads the record again. Labels,
// other annotations and other data are the cluster's; nothing else the
// edge sent is written. The reply carries the record as stored (name,
// namespace, uid, resourceVersion, creationTimestamp and the record), for
// the edge's next update.
//
// Within its pool a node may take the record whenever it likes, as any
// candidate may: expiry is judged by the candidates (each by its own
// clock, from when it saw the record change, as client-go's leader
// election does), not by the gateway, which keeps no memory of records.
//
// Whether the sender leads its pool (for a sync record) is read from
// Options.Records: in the gateway a poolcheck.RecordCache, an informer; a
// record it has not synced is Unavailable. The record an update is made on
// is still read with a GET: the informer's copy is trimmed to the
// election annotation (it may not be the base of a write: the labels,
// annotations and data a write keeps are the cluster's), and the write
// that follows costs a request anyway.
//
// A sender refused too often is not looked at: every refusal but
// Unavailable (a conflict included: each cost a GET and a write) takes a
// token of the sender's bucket (poolcheck.Limiter, Options.Limit: 20 in a
// row, given back over a minute), and a sender with none left is answered
// tunnel.RateLimited, before any check and without a request to the
// apiserver, until a token is back; logged once when it runs out.
//
// Every answer is counted in tether_gateway_election_writes_total by
// result (ok, rate_limited or the refusal's code); every other refusal is
// logged with the node, the pool, the record and the reason (a conflict,
// routine between candidates, at info; the others at warn). Nothing is
// written on a refusal.
package election

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/gateway/poolcheck"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// Options configure New.
type Options struct {
	// Client reads and writes the ConfigMaps of tether-system with the
	// gateway's identity. Required.
	Client kubernetes.Interface
	// Nodes tells the senders' pools. Required.
	Nodes poolcheck.NodePools
	// Records reads the election records for the leader check of a sync
	// record (a poolcheck.RecordCache); nil means a GET with Client.
	Records record.ConfigMapGetter
	// Limit is how many refusals a sender may draw before it is answered
	// tunnel.RateLimited; zero means poolcheck.DefaultLimit.
	Limit poolcheck.Limit
	// MaxLease is the pools' configured lease duration (the gateway's
	// --pool-lease-duration, equal to the edges'): an election record's
	// leaseDurationSeconds is written at most that long, and a sync record
	// is taken only from a leader whose record, so bounded, has not
	// expired. Zero means record.DefaultLeaseDuration.
	MaxLease time.Duration
	// Clock clamps the records' times, decides whether an election record
	// has expired and gives back the refused senders' tokens; nil means
	// the real clock.
	Clock clock.PassiveClock
	// Logger receives refusals and, at debug, writes; nil discards.
	Logger *slog.Logger
	// Registerer, if set, gets the handler's metrics (metrics.go).
	Registerer prometheus.Registerer
}

// Handler answers the edges' election requests; it implements the tunnel
// server's Elections.
type Handler struct {
	client kubernetes.Interface
	check  poolcheck.Checker
	limit  *poolcheck.Limiter
	clock  clock.PassiveClock
	log    *slog.Logger
	*metrics
}

// New returns a Handler.
func New(o Options) (*Handler, error) {
	if o.Client == nil || o.Nodes == nil {
		return nil, errors.New("election records: a Kubernetes client and the nodes' pools are required")
	}
	records := o.Records
	if records == nil {
		records = o.Client.CoreV1().ConfigMaps(record.Namespace)
	}
	if o.MaxLease <= 0 {
		o.MaxLease = record.DefaultLeaseDuration
	}
	h := &Handler{client: o.Client, clock: o.Clock, log: o.Logger,
		check: poolcheck.Checker{Nodes: o.Nodes, Records: records, MaxLease: o.MaxLease},
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
		return nil, fmt.Errorf("register election record metrics: %w", err)
	}
	return h, nil
}

// Elect checks req from sender and writes its record (see the package
// doc).
func (h *Handler) Elect(ctx context.Context, sender string, req tunnel.ElectionRequest) tunnel.ElectionReply {
	attrs := []any{"node", sender, "pool", req.Pool, "record", req.Record.String(), "op", req.Op.String()}
	if err := h.limit.Allow(sender); err != nil {
		r := poolcheck.AsRefusal(err)
		h.result(r.Code)
		h.log.Debug("election record write refused", append(attrs, "reason", r.Code.String(), "err", r.Msg)...)
		return tunnel.ElectionReply{Reply: tunnel.Reply{Code: r.Code, Message: r.Msg}}
	}
	stored, err := h.elect(ctx, sender, req)
	var body []byte
	if err == nil {
		if body, err = json.Marshal(stored); err == nil && len(body) > tunnel.MaxConfigMapLen {
			err = poolcheck.Refuse(tunnel.Unavailable, "record %s/%s written, but of %d bytes as stored", stored.Namespace, stored.Name, len(body))
		}
	}
	r := poolcheck.AsRefusal(err)
	if r != nil {
		h.result(r.Code)
		level := slog.LevelWarn
		if r.Code == tunnel.Conflict {
			level = slog.LevelInfo
		}
		h.log.Log(ctx, level, "election record write refused", append(attrs, "reason", r.Code.String(), "err", r.Msg)...)
		if h.limit.Refused(sender, r.Code) {
			h.log.Warn("sender refused too often: its election record writes are answered rate_limited for a while", attrs...)
		}
		return tunnel.ElectionReply{Reply: tunnel.Reply{Code: r.Code, Message: r.Msg}}
	}
	h.result(tunnel.OK)
	h.log.Debug("election record written", append(attrs, "resource_version", stored.ResourceVersion)...)
	return tunnel.ElectionReply{Reply: tunnel.Reply{Code: tunnel.OK}, ConfigMap: body}
}

// elect returns the record as stored (only what the reply carries); the
// error is a *poolcheck.Refusal, or an apiserver error.
func (h *Handler) elect(ctx context.Context, sender string, req tunnel.ElectionRequest) (*corev1.ConfigMap, error) {
	if err := h.check.Member(ctx, sender, req.Pool); err != nil {
		return nil, err
	}
	sent, err := parseConfigMap(req)
	if err != nil {
		return nil, err
	}
	var cur *corev1.ConfigMap // the stored object an update is made on
	if req.Op == tunnel.ElectionUpdate {
		if cur, err = h.configMaps().Get(ctx, sent.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return nil, poolcheck.Refuse(tunnel.Conflict, "record %s/%s is gone (deleted since version %s)", sent.Namespace, sent.Name, sent.ResourceVersion)
		} else if err != nil {
			return nil, poolcheck.Refuse(tunnel.Unavailable, "read record %s/%s: %v", sent.Namespace, sent.Name, err)
		}
	}
	now := h.clock.Now()
	var write *corev1.ConfigMap
	switch req.Record {
	case tunnel.RecordElection:
		write, err = h.electionRecord(sender, sent, cur, now)
	default:
		write, err = h.syncRecord(ctx, sender, req.Pool, sent, cur, now)
	}
	if err != nil {
		return nil, err
	}
	var stored *corev1.ConfigMap
	if cur == nil {
		stored, err = h.configMaps().Create(ctx, write, metav1.CreateOptions{})
	} else {
		stored, err = h.configMaps().Update(ctx, write, metav1.UpdateOptions{})
	}
	switch {
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err), apierrors.IsNotFound(err):
		return nil, poolcheck.Refuse(tunnel.Conflict, "%s %s/%s: %v", req.Op, write.Namespace, write.Name, err)
	case apierrors.IsInvalid(err):
		return nil, poolcheck.Refuse(tunnel.BadRecord, "%s %s/%s: %v", req.Op, write.Namespace, write.Name, err)
	case err != nil:
		return nil, poolcheck.Refuse(tunnel.Unavailable, "%s %s/%s: %v", req.Op, write.Namespace, write.Name, err)
	}
	return reply(stored, req.Record), nil
}

func (h *Handler) configMaps() typedcorev1.ConfigMapInterface {
	return h.client.CoreV1().ConfigMaps(record.Namespace)
}

// parseConfigMap decodes the sent ConfigMap and checks that it is the
// pool's record of the kind asked.
func parseConfigMap(req tunnel.ElectionRequest) (*corev1.ConfigMap, error) {
	var cm corev1.ConfigMap
	if err := json.Unmarshal(req.ConfigMap, &cm); err != nil {
		return nil, poolcheck.Refuse(tunnel.BadRecord, "not a ConfigMap: %v", err)
	}
	if (cm.APIVersion != "" && cm.APIVersion != "v1") || (cm.Kind != "" && cm.Kind != "ConfigMap") {
		return nil, poolcheck.Refuse(tunnel.BadRecord, "a %s %s, not a ConfigMap", cm.APIVersion, cm.Kind)
	}
	want := record.ElectionName(req.Pool)
	if req.Record == tunnel.RecordSync {
		want = record.SyncName(req.Pool)
	}
	if (cm.Namespace != "" && cm.Namespace != record.Namespace) || cm.Name != want {
		return nil, poolcheck.Refuse(tunnel.BadRecord, "ConfigMap %s/%s is not pool %s's %s record %s/%s", cm.Namespace, cm.Name,
			req.Pool, req.Record, record.Namespace, want)
	}
	cm.Namespace = record.Namespace
	if req.Op == tunnel.ElectionUpdate && cm.ResourceVersion == "" {
		return nil, poolcheck.Refuse(tunnel.BadRecord, "an update of %s/%s names no resourceVersion", cm.Namespace, cm.Name)
	}
	return &cm, nil
}

// electionRecord checks the election record sent and returns the object
// to write: cur (nil to create one) with the record, clamped to now.
func (h *Handler) electionRecord(sender string, sent, cur *corev1.ConfigMap, now time.Time) (*corev1.ConfigMap, error) {
	if _, ok := sent.Annotations[record.ElectionAnnotation]; !ok {
		return nil, poolcheck.Refuse(tunnel.BadRecord, "%s/%s has no %s annotation", sent.Namespace, sent.Name, record.ElectionAnnotation)
	}
	rec, err := record.DecodeElection(sent)
	if err != nil {
		return nil, poolcheck.Refuse(tunnel.BadRecord, "election record %s/%s: %v", sent.Namespace, sent.Name, err)
	}
	if rec.LeaseDurationSeconds < 0 || rec.LeaderTransitions < 0 {
		return nil, poolcheck.Refuse(tunnel.BadRecord, "election record %s/%s: negative leaseDurationSeconds or leaderTransitions", sent.Namespace, sent.Name)
	}
	switch rec.HolderIdentity {
	case sender:
	case "":
		// A release: only the holder's.
		if cur == nil {
			return nil, poolcheck.Refuse(tunnel.NotHolder, "a new election record %s/%s must name %s as holder", sent.Namespace, sent.Name, sender)
		}
		held, err := record.DecodeElection(cur)
		if err != nil {
			return nil, poolcheck.Refuse(tunnel.Unavailable, "stored election record %s/%s: %v", cur.Namespace, cur.Name, err)
		}
		if held.HolderIdentity != sender {
			return nil, poolcheck.Refuse(tunnel.NotLeader, "%s may not release %s/%s, held by %q", sender, cur.Namespace, cur.Name, held.HolderIdentity)
		}
	default:
		return nil, poolcheck.Refuse(tunnel.NotHolder, "election record %s/%s names %s as holder, not the sender %s", sent.Namespace, sent.Name, rec.HolderIdentity, sender)
	}
	clampTime(&rec.RenewTime, now)
	clampTime(&rec.AcquireTime, now)
	// The holder chooses its lease: stored at most the pools' own, so
	// that edges and tools of any version read no longer one.
	if max := int(h.check.MaxLease / time.Second); rec.LeaseDurationSeconds > max {
		rec.LeaseDurationSeconds = max
	}
	out := newObject(sent, cur)
	if err := record.SetElection(out, rec); err != nil {
		return nil, poolcheck.Refuse(tunnel.BadRecord, "election record %s/%s: %v", sent.Namespace, sent.Name, err)
	}
	return out, nil
}

// syncRecord checks the sync record sent and returns the object to write:
// cur (nil to create one) with the record, clamped to now.
func (h *Handler) syncRecord(ctx context.Context, sender, pool string, sent, cur *corev1.ConfigMap, now time.Time) (*corev1.ConfigMap, error) {
	rec, err := record.DecodeSync(sent)
	if err != nil {
		return nil, poolcheck.Refuse(tunnel.BadRecord, "%s/%s: %v", sent.Namespace, sent.Name, err)
	}
	if rec.LeaseDurationSeconds < 0 {
		return nil, poolcheck.Refuse(tunnel.BadRecord, "%s/%s: negative leaseDurationSeconds", sent.Namespace, sent.Name)
	}
	if rec.HolderIdentity != sender {
		return nil, poolcheck.Refuse(tunnel.NotHolder, "sync record %s/%s names %q as holder, not the sender %s", sent.Namespace, sent.Name, rec.HolderIdentity, sender)
	}
	if err := h.check.Leader(ctx, sender, pool, now); err != nil {
		return nil, err
	}
	if rec.RenewTime.After(now) {
		rec.RenewTime = now
	}
	rec.LeaseDurationSeconds = min(rec.LeaseDurationSeconds, record.SyncLeaseSeconds)
	out := newObject(sent, cur)
	if out.Data == nil {
		out.Data = map[string]string{}
	}
	for k, v := range rec.Data() {
		out.Data[k] = v
	}
	return out, nil
}

// newObject is the object a write starts from: a copy of cur, the stored
// one, with the resourceVersion the edge based its write on; or, to
// create one, a ConfigMap with nothing but sent's name.
func newObject(sent, cur *corev1.ConfigMap) *corev1.ConfigMap {
	if cur == nil {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: sent.Name, Namespace: record.Namespace}}
	}
	out := cur.DeepCopy()
	out.ResourceVersion = sent.ResourceVersion
	return out
}

// clampTime sets t to now if it is later.
func clampTime(t *metav1.Time, now time.Time) {
	if t.After(now) {
		*t = metav1.NewTime(now)
	}
}

// reply is what the edge gets back of the stored record: its identity,
// its version and the record.
func reply(stored *corev1.ConfigMap, kind tunnel.RecordKind) *corev1.ConfigMap {
	out := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: stored.Name, Namespace: stored.Namespace, UID: stored.UID,
			ResourceVersion: stored.ResourceVersion, CreationTimestamp: stored.CreationTimestamp},
	}
	if kind == tunnel.RecordElection {
		out.Annotations = map[string]string{record.ElectionAnnotation: stored.Annotations[record.ElectionAnnotation]}
		return out
	}
	out.Data = map[string]string{}
	for k := range (record.Sync{}).Data() {
		out.Data[k] = stored.Data[k]
	}
	return out
}
