package apiproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/internal/statusapi"
)

// Results of a replayed write, the "result" label of
// queue_replayed_total.
const (
	replayApplied  = "applied"
	replayObsolete = "obsolete"
	replayRejected = "rejected"
	// A patch queued later took its place (coalesce.go).
	replayCoalesced = "coalesced"
)

// Backoff of a queued write the cloud answers 5xx or 429 (per write),
// and of the replay when the cloud does not answer at all: the n-th
// failure waits a random time between half and all of
// min(replayBackoffBase·2ⁿ⁻¹, replayBackoffMax), or longer when a
// Retry-After asks for it (up to replayBackoffMax).
const (
	replayBackoffBase = time.Second
	replayBackoffMax  = 2 * time.Minute
)

// errNotHealthy stops a replay when the cloud goes away again.
var errNotHealthy = errors.New("no apiserver is healthy")

// storeError is a failure of the cache to record that a write is being
// sent: the write is not sent.
type storeError struct{ err error }

func (e *storeError) Error() string { return e.err.Error() }

// refusedForNow is a 5xx or 429 answer to a replayed request: the write
// stays queued and is tried again after a backoff.
type refusedForNow struct {
	what       string
	code       int
	message    string
	retryAfter time.Duration
}

func (e *refusedForNow) Error() string {
	return fmt.Sprintf("%s: %d %s", e.what, e.code, e.message)
}

// retryState is the backoff of one queued write (or, under seq 0, of the
// replay as a whole). It is kept in memory: a restarted proxy tries each
// write again at once.
type retryState struct {
	failures int
	next     time.Time
}

// replayBackoff is the wait after the failures-th failure in a row.
func replayBackoff(failures int, retryAfter time.Duration) time.Duration {
	d := replayBackoffMax
	if failures <= 20 {
		d = min(replayBackoffBase<<max(failures-1, 0), replayBackoffMax)
	}
	d = d/2 + rand.N(d/2+1)
	if retryAfter > d {
		d = min(retryAfter, replayBackoffMax)
	}
	return d
}

// pendingObject is what the queue holds of one object.
type pendingObject struct {
	writes  int
	lastPut uint64 // seq of the latest update (PUT), 0 if none

	// The latest queued write (0 once it is replayed), and whether a
	// patch may take its place (coalesce.go).
	last            uint64
	lastCoalescible bool
	lastComponent   string
	lastContentType string
}

// Run replays queued status writes whenever the cloud is healthy, until
// ctx ends. A write the cloud answers 5xx or 429 backs off on its own
// (jittered, bounded by replayBackoffMax) while the writes of other
// objects go on; later writes of the same object wait behind it, unless
// a later update (PUT) replaces it.
func (p *Proxy) Run(ctx context.Context) error {
	for {
		changed := p.up.Changed()
		var wake clock.Timer
		var wakeC <-chan time.Time
		if p.up.Healthy() && p.queueLen() > 0 {
			if next := p.replay(ctx); !next.IsZero() {
				wake = p.clock.NewTimer(next.Sub(p.clock.Now()))
				wakeC = wake.C()
			}
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-p.replayCh:
		case <-wakeC:
		}
		if wake != nil {
			wake.Stop()
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// replay goes once through the queue, in order, and returns when the
// next write that is backing off is due (zero if none). A write is dropped
// as obsolete when a later update (PUT) of the same object in the queue
// replaces it, when the object is gone or was recreated upstream (another
// UID), or when another field manager wrote its status upstream after the
// write was queued; as rejected when the cloud answers it 4xx.
func (p *Proxy) replay(ctx context.Context) (next time.Time) {
	p.takeReplaced()
	now := p.clock.Now()
	if r := p.retries[0]; r != nil && r.next.After(now) {
		return r.next // the cloud did not answer lately
	}
	waiting := map[string]bool{} // objects with an earlier write still queued
	counts := map[string]int{}
	defer func() {
		if len(counts) > 0 {
			p.log.Info("queued status writes replayed", "applied", counts[replayApplied], "obsolete", counts[replayObsolete],
				"rejected", counts[replayRejected], "still_queued", p.queueLen())
		}
	}()
	for q, err := range p.store.QueuedWrites(0) {
		if err != nil {
			p.log.Error("cannot read the queue of status writes", "err", err)
			return p.backOff(0, p.clock.Now(), 0)
		}
		key := objectKey(q)
		if waiting[key] {
			continue
		}
		var result, why string
		if p.lastPut(key) > q.Seq {
			result, why = replayObsolete, "a later update of the object in the queue replaces it"
		} else if r := p.retries[q.Seq]; r != nil && r.next.After(now) {
			waiting[key] = true
			next = earliest(next, r.next)
			continue
		} else {
			if !p.up.Healthy() || ctx.Err() != nil {
				return time.Time{} // Run starts again when the cloud is back
			}
			if !p.startReplay(q.Seq) {
				continue // a later patch took its place
			}
			result, why, err = p.replayOne(ctx, q)
			p.doneReplay()
			var rf *refusedForNow
			var se *storeError
			switch {
			case ctx.Err() != nil:
				return time.Time{}
			case errors.As(err, &se):
				p.log.Error("cannot mark a queued status write as being sent; replay paused", "seq", q.Seq, "err", se.err)
				return p.backOff(0, p.clock.Now(), 0)
			case errors.As(err, &rf):
				waiting[key] = true
				at := p.backOff(q.Seq, p.clock.Now(), rf.retryAfter)
				next = earliest(next, at)
				p.log.Warn("queued status write refused for now by the cloud; trying it again later",
					"seq", q.Seq, "method", q.Method, "path", q.Path, "err", err,
					"failures", p.retries[q.Seq].failures, "retry_in", at.Sub(p.clock.Now()))
				continue
			case err != nil:
				at := p.backOff(0, p.clock.Now(), 0)
				p.log.Warn("replay of queued status writes paused: the cloud does not answer", "queued", p.queueLen(),
					"write", fmt.Sprintf("%d (%s %s)", q.Seq, q.Method, q.Path), "err", err, "retry_in", at.Sub(p.clock.Now()))
				return at
			}
			delete(p.retries, 0)
		}
		if err := p.dequeue(q, outcomeOf(result)); err != nil {
			p.log.Error("cannot remove a replayed write from the queue", "seq", q.Seq, "err", err)
			return p.backOff(0, p.clock.Now(), 0)
		}
		counts[result]++
		p.m.replayed.WithLabelValues(result).Inc()
		attrs := []any{"seq", q.Seq, "component", q.Component, "method", q.Method, "path", q.Path, "queued_at", q.QueuedAt, "why", why}
		if result == replayRejected {
			// What the cloud refused is dropped: say what it was.
			attrs = append(attrs, "content_type", q.ContentType, "body", truncate(q.Body, 2048))
		}
		p.log.Log(ctx, slogLevel(result), "queued status write "+result, attrs...)
	}
	return next
}

// backOff records one more failure of a write (seq 0: of the replay) and
// returns when to try again.
func (p *Proxy) backOff(seq uint64, now time.Time, retryAfter time.Duration) time.Time {
	r := p.retries[seq]
	if r == nil {
		r = &retryState{}
		p.retries[seq] = r
	}
	r.failures++
	r.next = now.Add(replayBackoff(r.failures, retryAfter))
	return r.next
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

func objectKey(q cache.QueuedWrite) string {
	return q.Group + "/" + q.Resource + "/" + q.Namespace + "/" + q.Name
}

// requestKey is objectKey for a request.
func requestKey(req request) string {
	return req.GVR.Group + "/" + req.GVR.Resource + "/" + req.Namespace + "/" + req.Name
}

// upstreamObject is the part of the current upstream object a replay
// checks.
type upstreamObject struct {
	Metadata struct {
		UID             string                      `json:"uid"`
		ResourceVersion string                      `json:"resourceVersion"`
		ManagedFields   []metav1.ManagedFieldsEntry `json:"managedFields"`
	} `json:"metadata"`
}

// replayOne checks whether one write is still wanted and sends it. An
// error means the write stays queued: a *refusedForNow when the cloud
// answered 5xx or 429, a *storeError when the cache could not mark it as
// being sent, any other when the cloud did not answer.
//
// Before the write is sent, the cache marks it as being sent
// (MarkSending, a transaction of its own); the transaction that dequeues
// it removes the mark. A mark found at the next send means an earlier
// send may have been applied: the process was killed between the send
// and the dequeue, or the send got no answer, or a 5xx, which does not
// say whether it was applied. That send is counted as resent in the
// queue's ledger and logged. Every other write is applied at most once;
// with the ledger, exactly once or counted as coalesced, obsolete or
// rejected.
func (p *Proxy) replayOne(ctx context.Context, q cache.QueuedWrite) (result, why string, err error) {
	objPath := strings.TrimSuffix(q.Path, "/status")
	marked := false
	for attempt := 0; ; attempt++ {
		a, err := p.send(ctx, q, http.MethodGet, objPath, "", nil)
		code, cur := a.code, a.body
		switch {
		case err != nil:
			return "", "", err
		case code == http.StatusNotFound:
			return replayObsolete, "the object was deleted upstream", nil
		case code == http.StatusForbidden:
			// The Node authorizer lets a node read only its own Node and
			// the pods bound to it: a pod deleted (or rebound) since is
			// forbidden, not missing.
			return replayObsolete, "the node may no longer read the object (deleted, or not bound to it): " + statusMessage(cur), nil
		case a.retryable():
			return "", "", a.refused("get " + objPath)
		case code != http.StatusOK:
			return replayRejected, fmt.Sprintf("get %s: %d %s", objPath, code, statusMessage(cur)), nil
		}
		var obj upstreamObject
		if err := json.Unmarshal(cur, &obj); err != nil {
			return replayRejected, "the upstream object does not decode: " + err.Error(), nil
		}
		if q.UID != "" && obj.Metadata.UID != q.UID {
			return replayObsolete, "the object was recreated upstream (uid " + obj.Metadata.UID + ")", nil
		}
		queuedAt := q.QueuedAt.Truncate(time.Second) // managedFields times have seconds only
		for _, mf := range obj.Metadata.ManagedFields {
			if mf.Subresource == "status" && mf.Manager != q.Component && mf.Time != nil && mf.Time.Time.After(queuedAt) {
				return replayObsolete, "status written upstream since by " + mf.Manager, nil
			}
		}
		body := q.Body
		if q.Method == http.MethodPut {
			if body, err = localapi.WithResourceVersion(body, localapi.ParseRV(obj.Metadata.ResourceVersion), "", ""); err != nil {
				return replayRejected, "the queued body does not decode: " + err.Error(), nil
			}
		}
		if !marked {
			resent, err := p.store.MarkSending(q.Seq)
			if err != nil {
				return "", "", &storeError{err}
			}
			marked = true
			if resent {
				p.log.Info("queued status write sent again: an earlier send of it may have been applied (the process ended before dequeuing it, or no answer settled it); counted as resent",
					"seq", q.Seq, "component", q.Component, "method", q.Method, "path", q.Path)
			}
		}
		a, err = p.send(ctx, q, q.Method, q.Path, q.ContentType, body)
		if errors.Is(err, errNotHealthy) || (err == nil && a.code == http.StatusTooManyRequests) {
			// Not sent, or refused before it was handled: the next send
			// is a first one.
			if err := p.store.Unmark(q.Seq); err != nil {
				p.log.Warn("cannot unmark a queued status write; its next send will count as resent", "seq", q.Seq, "err", err)
			}
		}
		code, resp := a.code, a.body
		switch {
		case err != nil:
			return "", "", err
		case code < 300:
			gvr := schema.GroupVersionResource{Group: q.Group, Version: q.Version, Resource: q.Resource}
			if o, err := localapi.DecodeObject(resp, "", ""); err == nil {
				p.store.Put(q.Component, gvr, o)
			}
			return replayApplied, "", nil
		case code == http.StatusConflict && q.Method == http.MethodPut && attempt < 3:
			continue // written in between: read it again
		case code == http.StatusConflict:
			return replayObsolete, "conflict: " + statusMessage(resp), nil
		case a.retryable():
			return "", "", a.refused(q.Method + " " + q.Path)
		default:
			return replayRejected, fmt.Sprintf("%d %s", code, statusMessage(resp)), nil
		}
	}
}

// answer is the cloud's answer to one request of a replay.
type answer struct {
	code       int
	body       []byte
	retryAfter time.Duration
}

// retryable reports whether the write stays queued, to be tried again:
// the cloud is overloaded or failing (5xx, 429).
func (a answer) retryable() bool {
	return a.code >= 500 || a.code == http.StatusTooManyRequests
}

func (a answer) refused(what string) error {
	return &refusedForNow{what: what, code: a.code, message: statusMessage(a.body), retryAfter: a.retryAfter}
}

// send makes one request of a replay, as the component that queued it.
// An error means the cloud did not answer.
func (p *Proxy) send(ctx context.Context, q cache.QueuedWrite, method, path, contentType string, body []byte) (answer, error) {
	srv, ok := p.up.Server()
	if !ok {
		return answer{}, errNotHealthy
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	u := &url.URL{Scheme: srv.Scheme, Host: srv.Host, Path: path}
	if method != http.MethodGet {
		u.RawQuery = q.RawQuery
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", q.UserAgent)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := p.rt.RoundTrip(req)
	if err != nil {
		p.up.Kick()
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxCachedResponse))
	if err != nil {
		return answer{}, err
	}
	a := answer{code: resp.StatusCode, body: b}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		a.retryAfter = time.Duration(s) * time.Second
	}
	return a, nil
}

func statusMessage(body []byte) string {
	var st metav1.Status
	if json.Unmarshal(body, &st) == nil && st.Message != "" {
		return st.Message
	}
	if len(body) > 200 {
		body = body[:200]
	}
	return string(body)
}

// outcomeOf is the ledger's name of a replay's result.
func outcomeOf(result string) cache.Outcome {
	switch result {
	case replayApplied:
		return cache.OutcomeApplied
	case replayRejected:
		return cache.OutcomeRejected
	}
	return cache.OutcomeObsolete
}

// queueLedger is the queue's ledger for /status, nil if it does not read.
func (p *Proxy) queueLedger() *statusapi.QueueLedger {
	l, err := p.store.Ledger()
	if err != nil {
		p.log.Warn("cannot read the queue's ledger", "err", err)
		return nil
	}
	return &statusapi.QueueLedger{Enqueued: l.Enqueued, Coalesced: l.Coalesced, Applied: l.Applied, Obsolete: l.Obsolete,
		Rejected: l.Rejected, Queued: l.Queued, Resent: l.Resent, Unconfirmed: l.Unconfirmed, Balanced: l.Balanced()}
}

func slogLevel(result string) slog.Level {
	switch result {
	case replayApplied:
		return slog.LevelDebug
	case replayObsolete:
		return slog.LevelInfo
	}
	return slog.LevelWarn
}
