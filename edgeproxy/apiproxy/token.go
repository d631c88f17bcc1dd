package apiproxy

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/localapi"
)

// Service-account tokens for projected volumes: kubelet asks for them
// with POST .../serviceaccounts/<sa>/token (a TokenRequest) and keeps the
// answers in memory only, so a kubelet restarted while the cloud is away
// cannot mount its pods' projected token volumes. The proxy keeps the
// cloud's last answer to each request of a cached component (in the
// cache's tokens bucket) and, offline, answers the same request with it,
// byte for byte, while the token is valid. It never mints a token, never
// rewrites one, and never answers a request bound to another pod UID.

var serviceAccountsGVR = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}

const (
	// tokenMargin: a token is served offline while it is valid for at
	// least that much longer by the edge's clock.
	tokenMargin = 30 * time.Second
	// maxTokenAnswer bounds the answers kept (one is a few KiB).
	maxTokenAnswer = 64 << 10
)

// Why a token request was refused offline, the "reason" label of
// tokens_refused_offline_total.
const (
	tokenMissing    = "missing"    // never answered online for this request
	tokenOtherUID   = "other_uid"  // answered only for another pod of that name
	tokenExpired    = "expired"    // the token's JWT expires within tokenMargin
	tokenUnreadable = "unreadable" // the TokenRequest does not decode
)

// isTokenRequest reports whether req asks for a service account's token.
func isTokenRequest(req localapi.Request) bool {
	return req.Verb == localapi.VerbCreate && req.GVR == serviceAccountsGVR && req.Subresource == "token" &&
		req.Namespace != "" && req.Name != ""
}

// token handles a TokenRequest of a cached component: relayed online,
// the cloud's answer kept before it is relayed; offline, or when the
// cloud does not answer, answered with the last token the cloud issued
// for the same request (serveToken).
func (p *Proxy) token(w http.ResponseWriter, r *http.Request, req request, healthy bool) string {
	body, err := readBody(r)
	if err != nil {
		writeStatus(w, http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge, nil, "%v", err)
		return servedError
	}
	key, keyErr := tokenKeyOf(r.Header.Get("Content-Type"), body, req)
	if !healthy {
		return p.serveToken(w, r, req, key, keyErr, unreachableMessage)
	}
	// The answer is read whole here, so the upstream request asks for
	// authentication/v1 (not the URL's core/v1): in protobuf if the
	// client takes it, since the proxy reads that group's protobuf.
	resp, err := p.rt.RoundTrip(p.upstreamRequest(r, body, clientAndCache, authenticationv1.SchemeGroupVersion))
	if err == nil {
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || keyErr != nil {
			p.relay(w, resp, clientOnly)
			return servedUpstream
		}
		var answer []byte
		if answer, err = io.ReadAll(io.LimitReader(resp.Body, maxTokenAnswer+1)); err == nil {
			copyHeader(w.Header(), resp.Header)
			if len(answer) <= maxTokenAnswer {
				p.keepToken(req, key, resp.Header.Get("Content-Type"), answer)
				w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
			}
			w.WriteHeader(resp.StatusCode)
			w.Write(answer)
			io.Copy(w, resp.Body)
			return servedUpstream
		}
		// Nothing was sent to the client yet: answered as offline.
	}
	if r.Context().Err() != nil {
		return servedError
	}
	p.up.Kick()
	p.log.Debug("apiserver did not answer a token request; answering it from the cache", "component", req.comp, "path", r.URL.Path, "err", err)
	return p.serveToken(w, r, req, key, keyErr, noAnswer(err))
}

// tokenKeyOf reads a TokenRequest body (JSON, YAML or protobuf) into the
// key its answer is kept under.
func tokenKeyOf(contentType string, body []byte, req request) (cache.TokenKey, error) {
	k := cache.TokenKey{Namespace: req.Namespace, ServiceAccount: req.Name}
	j, err := bodyJSON(contentType, body)
	if err != nil {
		return k, err
	}
	var tr authenticationv1.TokenRequest
	if err := json.Unmarshal(j, &tr); err != nil {
		return k, fmt.Errorf("decode TokenRequest: %w", err)
	}
	k.Audiences, k.RequestUID = tr.Spec.Audiences, string(tr.UID)
	if k.Audiences == nil {
		k.Audiences = []string{}
	}
	if tr.Spec.ExpirationSeconds != nil {
		k.ExpirationSeconds = *tr.Spec.ExpirationSeconds
	}
	if ref := tr.Spec.BoundObjectRef; ref != nil {
		k.BoundAPIVersion, k.BoundKind, k.BoundName, k.BoundUID = ref.APIVersion, ref.Kind, ref.Name, string(ref.UID)
	}
	return k, nil
}

// keepToken stores the cloud's answer to a TokenRequest, if it is a
// token bound to the pod UID the request named.
func (p *Proxy) keepToken(req request, key cache.TokenKey, contentType string, answer []byte) {
	t, err := tokenOf(key, contentType, answer, p.clock.Now())
	if err == nil {
		p.indexToken(t) // the pod listener's ledger, in memory
		err = p.store.PutToken(req.comp, t)
	}
	if err != nil {
		p.m.cacheFailures.Inc()
		p.log.Warn("service-account token not kept for offline use", "component", req.comp,
			"namespace", key.Namespace, "serviceaccount", key.ServiceAccount, "pod", key.BoundName, "uid", key.BoundUID, "err", err)
		return
	}
	p.m.tokensStored.WithLabelValues(req.label).Inc()
}

// tokenOf is the entry kept for an answer: its bytes, and the token's
// expiry (the JWT's exp, not verified: the edge has no key; else the
// answer's status.expirationTimestamp) and bound pod UID.
func tokenOf(key cache.TokenKey, contentType string, answer []byte, now time.Time) (*cache.Token, error) {
	j, err := bodyJSON(contentType, answer)
	if err != nil {
		return nil, err
	}
	var tr authenticationv1.TokenRequest
	if err := json.Unmarshal(j, &tr); err != nil {
		return nil, fmt.Errorf("decode the TokenRequest answer: %w", err)
	}
	uid := key.BoundUID
	if ref := tr.Spec.BoundObjectRef; ref != nil && ref.UID != "" {
		uid = string(ref.UID)
	}
	switch {
	case key.BoundUID == "" || uid == "":
		return nil, errors.New("the token is not bound to a pod UID")
	case uid != key.BoundUID:
		return nil, fmt.Errorf("the token is bound to pod UID %s, the request to %s", uid, key.BoundUID)
	}
	exp, ok := jwtExpiry(tr.Status.Token)
	if !ok {
		exp = tr.Status.ExpirationTimestamp.Time
	}
	if exp.IsZero() {
		return nil, errors.New("the answer has no expiry")
	}
	return &cache.Token{Key: key, ContentType: contentType, Answer: answer, Expires: exp, BoundUID: uid, Stored: now}, nil
}

// jwtExpiry reads the exp claim of a JWT's payload, without verifying
// the signature.
func jwtExpiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *json.Number `json:"exp"`
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	exp, err := claims.Exp.Float64()
	if err != nil || exp <= 0 {
		return time.Time{}, false
	}
	return time.Unix(int64(exp), 0), true
}

// serveToken answers a TokenRequest without the cloud: 201 with the
// cloud's last answer to the same request of the same component, as it
// was, while its token is valid for tokenMargin more; else 503 saying
// why. Never 404: kubelet would take it for an apiserver without the
// TokenRequest API, and remember that.
func (p *Proxy) serveToken(w http.ResponseWriter, r *http.Request, req request, key cache.TokenKey, keyErr error, why string) string {
	refused := func(reason, format string, args ...any) string {
		p.m.tokensRefused.WithLabelValues(req.label, reason).Inc()
		refuse(w, why, format, args...)
		return servedRefused
	}
	if keyErr != nil {
		return refused(tokenUnreadable, "the token request cannot be read by the edge: %v", keyErr)
	}
	pod := fmt.Sprintf("pod %s/%s uid %s", key.Namespace, key.BoundName, key.BoundUID)
	t, others, err := p.store.Token(req.comp, key)
	if err != nil {
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, nil, "tether-edge: %v", err)
		return servedError
	}
	if t == nil {
		if len(others) > 0 {
			if p.tokenLog.first(key) {
				p.log.Info("no service-account token for this pod UID offline; the cloud issued one for another pod of that name",
					"component", req.comp, "namespace", key.Namespace, "serviceaccount", key.ServiceAccount,
					"pod", key.BoundName, "uid", key.BoundUID, "issued_for_uids", strings.Join(others, ","))
			}
			return refused(tokenOtherUID, "the cloud never issued a token of service account %s for %s (only for uid %s): the edge never mints one",
				key.ServiceAccount, pod, strings.Join(others, ", "))
		}
		return refused(tokenMissing, "the cloud never issued a token of service account %s to %s for %s with this request: the edge never mints one",
			key.ServiceAccount, req.comp, pod)
	}
	if !p.clock.Now().Add(tokenMargin).Before(t.Expires) {
		return refused(tokenExpired, "the last token of service account %s the cloud issued for %s expired at %s",
			key.ServiceAccount, pod, t.Expires.UTC().Format(time.RFC3339))
	}
	ct, answer := t.ContentType, t.Answer
	if !accepts(r.Header.Get("Accept"), ct) {
		if answer, err = bodyJSON(ct, answer); err != nil {
			writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, nil, "tether-edge: %v", err)
			return servedError
		}
		ct = runtime.ContentTypeJSON
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
	w.WriteHeader(http.StatusCreated)
	w.Write(answer)
	p.m.tokensServed.WithLabelValues(req.label).Inc()
	return servedCache
}

// accepts reports whether an Accept header takes contentType: a client
// that asked JSON gets the kept protobuf answer as JSON.
func accepts(accept, contentType string) bool {
	return accept == "" || strings.Contains(accept, "*/*") || strings.Contains(accept, mediaType(contentType))
}

// podDeleted forgets the tokens bound to a pod a watch says is deleted:
// a watch of pods whose selectors (none, or the kubelet's spec.nodeName)
// no pod leaves but by its deletion.
func (wc *watchCacher) podDeleted(o *localapi.Object) {
	if wc.gvr != podsGVR || o.UID == "" || (wc.scope.Labels != nil && !wc.scope.Labels.Empty()) {
		return
	}
	if wc.scope.Fields != nil {
		for _, r := range wc.scope.Fields.Requirements() {
			if r.Field != "spec.nodeName" && r.Field != "metadata.name" && r.Field != "metadata.namespace" {
				return
			}
		}
	}
	wc.p.store.ForgetTokens(o.UID)
	wc.p.podIDs.forgetUID(o.UID)
}

// tokenLog remembers the requests whose miss was logged, so that the
// kubelet's retries (every few seconds to two minutes) log it once.
type tokenLog struct {
	mu   sync.Mutex
	seen map[string]bool
}

// first reports whether k was not seen before (the set is emptied past
// a bound).
func (l *tokenLog) first(k cache.TokenKey) bool {
	s := fmt.Sprintf("%q", []string{k.Namespace, k.ServiceAccount, k.BoundName, k.BoundUID, strings.Join(k.Audiences, ","),
		strconv.FormatInt(k.ExpirationSeconds, 10), k.RequestUID})
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[s] {
		return false
	}
	if l.seen == nil || len(l.seen) >= 1024 {
		l.seen = map[string]bool{}
	}
	l.seen[s] = true
	return true
}
