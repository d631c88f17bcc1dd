package writequeue

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

	"github.com/tether-edge/tether/edgeproxy/apiproxy/internal/statuspatch"
	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/localapi"
)

// Results of a replayed write, the "result" label of
// queue_replayed_total.
const (
	replayApplied  = "applied"
	replayObsolete = "obsolete"
	replayRejected = "rejected"
	// A status patch of the node's own Node, sent rebased on the Node
	// as it is upstream (rebase.go); the ledger counts it applied.
	replayRebased = "rebased"
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

// maxAnswer bounds the apiserver's answers the replay reads.
const maxAnswer = 256 << 20

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

// replay goes once through the queue, in order, and returns when the
// next write that is backing off is due (zero if none). A write is dropped
// as obsolete when a later update (PUT) of the same object in the queue
// replaces it, when the object is gone or was recreated upstream (another
// UID), or when another field manager wrote its status upstream after the
// write was queued; as rejected when the cloud answers it 4xx. A status
// patch of this node's own Node whose conditions were written upstream
// since is rebased on the upstream Node instead (rebase.go).
func (q *Queue) replay(ctx context.Context) (next time.Time) {
	q.takeReplaced()
	now := q.clock.Now()
	if r := q.retries[0]; r != nil && r.next.After(now) {
		return r.next // the cloud did not answer lately
	}
	waiting := map[Object]bool{} // objects with an earlier write still queued
	counts := map[string]int{}
	defer func() {
		if len(counts) > 0 {
			q.log.Info("queued status writes replayed", "applied", counts[replayApplied], "rebased", counts[replayRebased], "obsolete", counts[replayObsolete],
				"rejected", counts[replayRejected], "still_queued", q.Len())
		}
	}()
	for w, err := range q.store.QueuedWrites(0) {
		if err != nil {
			q.log.Error("cannot read the queue of status writes", "err", err)
			return q.backOff(0, q.clock.Now(), 0)
		}
		key := ObjectOf(w)
		if waiting[key] {
			continue
		}
		var result, why string
		if q.lastPut(key) > w.Seq {
			result, why = replayObsolete, "a later update of the object in the queue replaces it"
		} else if r := q.retries[w.Seq]; r != nil && r.next.After(now) {
			waiting[key] = true
			next = earliest(next, r.next)
			continue
		} else {
			if !q.up.Healthy() || ctx.Err() != nil {
				return time.Time{} // Run starts again when the cloud is back
			}
			if !q.startReplay(w.Seq) {
				continue // a later patch took its place
			}
			result, why, err = q.replayOne(ctx, w)
			q.doneReplay()
			var rf *refusedForNow
			var se *storeError
			switch {
			case ctx.Err() != nil:
				return time.Time{}
			case errors.As(err, &se):
				q.log.Error("cannot mark a queued status write as being sent; replay paused", "seq", w.Seq, "err", se.err)
				return q.backOff(0, q.clock.Now(), 0)
			case errors.As(err, &rf):
				waiting[key] = true
				at := q.backOff(w.Seq, q.clock.Now(), rf.retryAfter)
				next = earliest(next, at)
				q.log.Warn("queued status write refused for now by the cloud; trying it again later",
					"seq", w.Seq, "method", w.Method, "path", w.Path, "err", err,
					"failures", q.retries[w.Seq].failures, "retry_in", at.Sub(q.clock.Now()))
				continue
			case err != nil:
				at := q.backOff(0, q.clock.Now(), 0)
				q.log.Warn("replay of queued status writes paused: the cloud does not answer", "queued", q.Len(),
					"write", fmt.Sprintf("%d (%s %s)", w.Seq, w.Method, w.Path), "err", err, "retry_in", at.Sub(q.clock.Now()))
				return at
			}
			delete(q.retries, 0)
		}
		if err := q.Dequeue(w, outcomeOf(result)); err != nil {
			q.log.Error("cannot remove a replayed write from the queue", "seq", w.Seq, "err", err)
			return q.backOff(0, q.clock.Now(), 0)
		}
		counts[result]++
		q.m.replayed.WithLabelValues(result).Inc()
		attrs := []any{"seq", w.Seq, "component", w.Component, "method", w.Method, "path", w.Path, "queued_at", w.QueuedAt, "why", why}
		if result == replayRejected {
			// What the cloud refused is dropped: say what it was.
			attrs = append(attrs, "content_type", w.ContentType, "body", truncate(w.Body, 2048))
		}
		q.log.Log(ctx, slogLevel(result), "queued status write "+result, attrs...)
	}
	return next
}

// backOff records one more failure of a write (seq 0: of the replay) and
// returns when to try again.
func (q *Queue) backOff(seq uint64, now time.Time, retryAfter time.Duration) time.Time {
	r := q.retries[seq]
	if r == nil {
		r = &retryState{}
		q.retries[seq] = r
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
func (q *Queue) replayOne(ctx context.Context, w cache.QueuedWrite) (result, why string, err error) {
	objPath := strings.TrimSuffix(w.Path, "/status")
	marked := false
	for attempt := 0; ; attempt++ {
		a, err := q.send(ctx, w, http.MethodGet, objPath, "", nil)
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
		if w.UID != "" && obj.Metadata.UID != w.UID {
			return replayObsolete, "the object was recreated upstream (uid " + obj.Metadata.UID + ")", nil
		}
		method, contentType, body := w.Method, w.ContentType, w.Body
		rebased := ""                                // why, when the write is sent rebased
		queuedAt := w.QueuedAt.Truncate(time.Second) // managedFields times have seconds only
		for _, mf := range obj.Metadata.ManagedFields {
			if mf.Subresource == "status" && mf.Manager != w.Component && mf.Time != nil && mf.Time.Time.After(queuedAt) {
				why := "status written upstream since by " + mf.Manager
				if !q.rebases(w) {
					return replayObsolete, why, nil
				}
				b, err := rebase(w, cur, q.clock.Now(), false)
				if err != nil {
					return replayObsolete, why + "; not rebased: " + err.Error(), nil
				}
				method, contentType, body = http.MethodPatch, statuspatch.StrategicMerge, b
				rebased = why + ": the conditions the write set were sent as a patch of the upstream Node"
				break
			}
		}
		if rebased == "" && q.rebases(w) {
			// kube-apiserver keeps no managedFields on Nodes: a condition
			// written upstream since shows only as a difference from the
			// base the patch was made against, which the patch alone would
			// not undo (a kubelet heartbeat carries no status).
			switch b, err := rebase(w, cur, q.clock.Now(), true); {
			case err == nil:
				contentType, body = statuspatch.StrategicMerge, b
				rebased = "the Node's conditions were written upstream since the write's base: the write and the conditions it set were sent as a patch of the upstream Node"
			case !errors.Is(err, errNothingToRebase):
				q.log.Warn("node status patch not rebased; sent as queued", "seq", w.Seq, "err", err)
			}
		}
		if w.Method == http.MethodPut {
			if body, err = localapi.WithResourceVersion(body, localapi.ParseRV(obj.Metadata.ResourceVersion), "", ""); err != nil {
				return replayRejected, "the queued body does not decode: " + err.Error(), nil
			}
		}
		if !marked {
			resent, err := q.store.MarkSending(w.Seq)
			if err != nil {
				return "", "", &storeError{err}
			}
			marked = true
			if resent {
				q.log.Info("queued status write sent again: an earlier send of it may have been applied (the process ended before dequeuing it, or no answer settled it); counted as resent",
					"seq", w.Seq, "component", w.Component, "method", w.Method, "path", w.Path)
			}
		}
		a, err = q.send(ctx, w, method, w.Path, contentType, body)
		if errors.Is(err, errNotHealthy) || (err == nil && a.code == http.StatusTooManyRequests) {
			// Not sent, or refused before it was handled: the next send
			// is a first one.
			if err := q.store.Unmark(w.Seq); err != nil {
				q.log.Warn("cannot unmark a queued status write; its next send will count as resent", "seq", w.Seq, "err", err)
			}
		}
		code, resp := a.code, a.body
		switch {
		case err != nil:
			return "", "", err
		case code < 300:
			gvr := schema.GroupVersionResource{Group: w.Group, Version: w.Version, Resource: w.Resource}
			if o, err := localapi.DecodeObject(resp, "", ""); err == nil {
				q.store.Put(w.Component, gvr, o)
			}
			if rebased != "" {
				return replayRebased, rebased, nil
			}
			return replayApplied, "", nil
		case code == http.StatusConflict && w.Method == http.MethodPut && attempt < 3:
			continue // written in between: read it again
		case code == http.StatusConflict:
			return replayObsolete, "conflict: " + statusMessage(resp), nil
		case a.retryable():
			return "", "", a.refused(w.Method + " " + w.Path)
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
func (q *Queue) send(ctx context.Context, w cache.QueuedWrite, method, path, contentType string, body []byte) (answer, error) {
	srv, ok := q.up.Server()
	if !ok {
		return answer{}, errNotHealthy
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	u := &url.URL{Scheme: srv.Scheme, Host: srv.Host, Path: path}
	if method != http.MethodGet {
		u.RawQuery = w.RawQuery
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
	req.Header.Set("User-Agent", w.UserAgent)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := q.rt.RoundTrip(req)
	if err != nil {
		q.up.Kick()
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
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
	case replayApplied, replayRebased:
		return cache.OutcomeApplied
	case replayRejected:
		return cache.OutcomeRejected
	}
	return cache.OutcomeObsolete
}

func slogLevel(result string) slog.Level {
	switch result {
	case replayApplied:
		return slog.LevelDebug
	case replayObsolete, replayRebased:
		return slog.LevelInfo
	}
	return slog.LevelWarn
}
