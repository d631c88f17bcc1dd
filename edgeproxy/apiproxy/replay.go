package apiproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/edgeproxy/cache"
)

// Results of a replayed write, the "result" label of
// queue_replayed_total.
const (
	replayApplied  = "applied"
	replayObsolete = "obsolete"
	replayRejected = "rejected"
)

// errNotHealthy stops a replay when the cloud goes away again.
var errNotHealthy = errors.New("no apiserver is healthy")

// Run replays queued status writes whenever the cloud is healthy, until
// ctx ends.
func (p *Proxy) Run(ctx context.Context) error {
	var retry <-chan time.Time
	for {
		changed := p.up.Changed()
		if retry == nil && p.up.Healthy() && p.queueLen() > 0 {
			if err := p.replay(ctx); err != nil && ctx.Err() == nil {
				p.log.Warn("replay of queued status writes paused", "queued", p.queueLen(), "err", err, "retry_in", replayRetry)
				t := p.clock.NewTimer(replayRetry)
				retry = t.C()
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-p.replayCh:
		case <-retry:
			retry = nil
		}
	}
}

// replay sends the queued writes in order. A write is dropped as obsolete
// when a later update (PUT) of the same object in the queue replaces it,
// when the object is gone or was recreated upstream (another UID), or
// when another field manager wrote its status upstream after the write
// was queued. It stops, keeping the rest, at the first write the cloud
// does not answer.
func (p *Proxy) replay(ctx context.Context) error {
	queued, err := p.store.Queued()
	if err != nil {
		return err
	}
	p.log.Info("cloud is back: replaying queued status writes", "queued", len(queued))
	lastPut := map[string]uint64{}
	for _, q := range queued {
		if q.Method == http.MethodPut {
			lastPut[objectKey(q)] = q.Seq
		}
	}
	counts := map[string]int{}
	for _, q := range queued {
		if !p.up.Healthy() {
			return errNotHealthy
		}
		var result, why string
		if s := lastPut[objectKey(q)]; s > q.Seq {
			result, why = replayObsolete, "a later update of the object in the queue replaces it"
		} else if result, why, err = p.replayOne(ctx, q); err != nil {
			return fmt.Errorf("write %d (%s %s): %w", q.Seq, q.Method, q.Path, err)
		}
		if err := p.store.Dequeue(q.Seq); err != nil {
			return err
		}
		p.queueAdd(-1)
		counts[result]++
		p.m.replayed.WithLabelValues(result).Inc()
		level := slogLevel(result)
		p.log.Log(ctx, level, "queued status write "+result, "seq", q.Seq, "method", q.Method, "path", q.Path,
			"queued_at", q.QueuedAt, "why", why)
	}
	p.log.Info("queued status writes replayed", "applied", counts[replayApplied], "obsolete", counts[replayObsolete], "rejected", counts[replayRejected])
	return nil
}

func objectKey(q cache.QueuedWrite) string {
	return q.Group + "/" + q.Resource + "/" + q.Namespace + "/" + q.Name
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
// error means the cloud did not answer: the write stays queued.
func (p *Proxy) replayOne(ctx context.Context, q cache.QueuedWrite) (result, why string, err error) {
	objPath := strings.TrimSuffix(q.Path, "/status")
	for attempt := 0; ; attempt++ {
		code, cur, err := p.send(ctx, q, http.MethodGet, objPath, "", nil)
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
		case code >= 500 || code == http.StatusTooManyRequests:
			return "", "", fmt.Errorf("get %s: %d", objPath, code)
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
			if body, err = withResourceVersion(body, cache.ParseRV(obj.Metadata.ResourceVersion), "", ""); err != nil {
				return replayRejected, "the queued body does not decode: " + err.Error(), nil
			}
		}
		code, resp, err := p.send(ctx, q, q.Method, q.Path, q.ContentType, body)
		switch {
		case err != nil:
			return "", "", err
		case code < 300:
			gvr := schema.GroupVersionResource{Group: q.Group, Version: q.Version, Resource: q.Resource}
			if o, err := cache.DecodeObject(resp, "", ""); err == nil {
				p.store.Put(q.Component, gvr, o)
			}
			return replayApplied, "", nil
		case code == http.StatusConflict && q.Method == http.MethodPut && attempt < 3:
			continue // written in between: read it again
		case code == http.StatusConflict:
			return replayObsolete, "conflict: " + statusMessage(resp), nil
		case code >= 500 || code == http.StatusTooManyRequests:
			return "", "", fmt.Errorf("%s %s: %d %s", q.Method, q.Path, code, statusMessage(resp))
		default:
			return replayRejected, fmt.Sprintf("%d %s", code, statusMessage(resp)), nil
		}
	}
}

// send makes one request of a replay, as the component that queued it.
func (p *Proxy) send(ctx context.Context, q cache.QueuedWrite, method, path, contentType string, body []byte) (int, []byte, error) {
	srv, ok := p.up.Server()
	if !ok {
		return 0, nil, errNotHealthy
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
		return 0, nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", q.UserAgent)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := p.rt.RoundTrip(req)
	if err != nil {
		p.up.Kick()
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxCachedResponse))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, b, nil
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

func slogLevel(result string) slog.Level {
	switch result {
	case replayApplied:
		return slog.LevelDebug
	case replayObsolete:
		return slog.LevelInfo
	}
	return slog.LevelWarn
}
