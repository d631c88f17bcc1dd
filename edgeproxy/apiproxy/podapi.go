package apiproxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/edgeproxy/apiproxy/podcache"
	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/localapi"
)

// The pod listener: pods of this node that use in-cluster config reach
// kube-apiserver through it (PodHandler, on tether-edge's
// --pod-api-listen, in TLS). Every request must carry a bearer token and
// is relayed with it, on a transport that shows the cloud no credential
// of the node (PodOptions.Transport). The User-Agent is never read.
//
// A token's identity is the entry of the token ledger (the cloud's
// answers to the TokenRequests the kubelet made through the proxy,
// token.go) whose JWT is exactly that token: namespace, service account,
// bound pod name and UID. Online, the gets and lists (and discovery
// reads) of such an identity are relayed and their 200 answers kept under the identity (package
// podcache); offline, the identity is served its own answer to the same
// request, byte for byte, while its token is valid. A token not in the
// ledger is relayed online uncached (the cloud authenticates it) and
// refused offline. Nothing of the node components' cache is ever served
// here, and nothing of a pod's is served to anyone else.

// PodOptions turn the pod listener on (Options.Pods).
type PodOptions struct {
	// Transport reaches the cloud apiservers with no client certificate
	// and no credential of the node (upstream.Upstreams.PodTransport).
	Transport http.RoundTripper
	// Cache keeps each identity's reads.
	Cache *podcache.Cache
	// Addresses and Port, when Addresses is set, are what the kubelet
	// sees of the Service default/kubernetes (its cluster IPs, and its
	// port 443), so that the in-cluster config it gives pods points at
	// the pod listener (podservice.go).
	Addresses []string
	Port      int32
}

// Served pod requests, the "served" label of pod_api_requests_total.
const (
	podServedCloud   = "cloud"
	podServedCache   = "cache"
	podServedRefused = "refused" // 401 without a token, 503 offline
	podServedError   = "error"
)

// podIdentity is who the cloud issued a token to, as the ledger says.
type podIdentity struct {
	Namespace, ServiceAccount, Pod, PodUID string
	// Expires is the token's JWT exp.
	Expires time.Time
}

// key names the identity in the pod cache: the token rotates, the
// identity stays.
func (i podIdentity) key() string {
	h := sha256.Sum256([]byte(strings.Join([]string{i.Namespace, i.ServiceAccount, i.Pod, i.PodUID}, "\x00")))
	return hex.EncodeToString(h[:])
}

// maxPodIdentities bounds the ledger index (the tokens bucket holds at
// most cache.MaxTokensPerComponent per component).
const maxPodIdentities = 8192

// podIdentities maps SHA-256(token) to the token's identity.
type podIdentities struct {
	mu     sync.Mutex
	byHash map[[sha256.Size]byte]podIdentity
}

func (ix *podIdentities) add(token string, id podIdentity, now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.byHash == nil {
		ix.byHash = map[[sha256.Size]byte]podIdentity{}
	}
	if len(ix.byHash) >= maxPodIdentities {
		for h, o := range ix.byHash {
			if !now.Before(o.Expires) {
				delete(ix.byHash, h)
			}
		}
	}
	if len(ix.byHash) >= maxPodIdentities {
		return
	}
	ix.byHash[sha256.Sum256([]byte(token))] = id
}

func (ix *podIdentities) lookup(token string) (podIdentity, bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	id, ok := ix.byHash[sha256.Sum256([]byte(token))]
	return id, ok
}

// forgetUID drops the identities bound to a pod that was deleted.
func (ix *podIdentities) forgetUID(uid string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for h, o := range ix.byHash {
		if o.PodUID == uid {
			delete(ix.byHash, h)
		}
	}
}

// indexToken adds a token of the ledger to the index: only tokens for
// the apiserver's own audience (none asked), bound to a pod.
func (p *Proxy) indexToken(t *cache.Token) {
	if p.podCache == nil || len(t.Key.Audiences) != 0 || t.BoundUID == "" || !p.clock.Now().Before(t.Expires) {
		return
	}
	j, err := bodyJSON(t.ContentType, t.Answer)
	if err != nil {
		return
	}
	var tr authenticationv1.TokenRequest
	if json.Unmarshal(j, &tr) != nil || tr.Status.Token == "" {
		return
	}
	p.podIDs.add(tr.Status.Token, podIdentity{Namespace: t.Key.Namespace, ServiceAccount: t.Key.ServiceAccount,
		Pod: t.Key.BoundName, PodUID: t.BoundUID, Expires: t.Expires}, p.clock.Now())
}

// loadPodIdentities builds the index from the tokens kept in the cache.
func (p *Proxy) loadPodIdentities() error {
	ts, err := p.store.Tokens()
	if err != nil {
		return err
	}
	for i := range ts {
		p.indexToken(&ts[i])
	}
	return nil
}

// PodHandler is the pod listener's handler; nil without Options.Pods.
func (p *Proxy) PodHandler() http.Handler {
	if p.podCache == nil {
		return nil
	}
	return http.HandlerFunc(p.servePod)
}

// ServePods serves pods on ln (a TLS listener) until ctx ends.
func (p *Proxy) ServePods(ctx context.Context, ln net.Listener) error {
	h := p.PodHandler()
	if h == nil {
		return errors.New("pod listener: no pod options")
	}
	return serveHTTP(ctx, ln, h, p.log, "pod API listener")
}

func (p *Proxy) servePod(w http.ResponseWriter, r *http.Request) {
	served := p.podServe(w, r)
	p.m.podRequests.WithLabelValues(served).Inc()
}

// bearerToken is the request's bearer token, if it has one.
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// podServe is the pod listener's decision table.
func (p *Proxy) podServe(w http.ResponseWriter, r *http.Request) string {
	token, ok := bearerToken(r)
	if !ok {
		writeStatus(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, nil,
			"tether-edge: the pod API listener needs a bearer token (the pod's service-account token)")
		return podServedRefused
	}
	id, known := p.podIDs.lookup(token)
	req := parseRequest(r)
	// Reads kept and served offline: gets and lists of resources, and
	// gets of paths that are no resource (discovery: /api, /apis/<g>/<v>,
	// /version), which clients such as kubectl make before a list.
	read := r.Method == http.MethodGet && req.Subresource == "" &&
		(req.Verb == localapi.VerbGet || req.Verb == localapi.VerbList || (!req.IsResource && isDiscovery(r)))
	cached := known && read
	ctx, cancel := context.WithTimeout(r.Context(), startReadWait)
	p.up.WaitKnown(ctx)
	cancel()
	if !p.up.Healthy() {
		return p.podOffline(w, r, id, known, read, unreachableMessage)
	}
	if !cached {
		p.podReverse.ServeHTTP(w, r)
		return podServedCloud
	}
	resp, err := p.podRT.RoundTrip(withoutBody(p.podUpstreamRequest(r)))
	if err != nil {
		if r.Context().Err() != nil {
			return podServedError
		}
		p.up.Kick()
		return p.podOffline(w, r, id, known, read, noAnswer(err))
	}
	defer resp.Body.Close()
	keep := resp.StatusCode == http.StatusOK && mediaType(resp.Header.Get("Content-Type")) == runtime.ContentTypeJSON
	if body := p.relay(w, resp, answerFor(keep)); body != nil {
		e := podcache.Entry{Key: podReadKey(r), ContentType: resp.Header.Get("Content-Type"), Body: body, Stored: p.clock.Now()}
		// A pod that polls gets the same answer again and again: kept
		// once, not written (and synced) at every read.
		if old, err := p.podCache.Get(id.key(), e.Key); err == nil && old != nil && old.ContentType == e.ContentType && bytes.Equal(old.Body, body) {
			return podServedCloud
		}
		if err := p.podCache.Put(id.key(), e); err != nil {
			p.m.podCacheFailures.Inc()
			p.log.Debug("pod read not kept for offline use", "namespace", id.Namespace, "serviceaccount", id.ServiceAccount,
				"pod", id.Pod, "path", r.URL.Path, "err", err)
		}
	}
	return podServedCloud
}

// isDiscovery reports whether r reads API discovery: /version, /api,
// /api/<version>, /apis, /apis/<group>, /apis/<group>/<version>. Other
// paths that are no resource (service and node proxies, openapi) may
// stream or be large: relayed, never kept.
func isDiscovery(r *http.Request) bool {
	p := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.URL.Query().Has("watch") || slices.Contains(p, "") {
		return false
	}
	switch p[0] {
	case "version":
		return len(p) == 1
	case "api":
		return len(p) <= 2
	case "apis":
		return len(p) <= 3
	}
	return false
}

// podReadKey is what a pod's read is kept under, beside its identity:
// the same request (method, path and query, and the media types it
// accepts) gets the same answer.
func podReadKey(r *http.Request) string {
	return r.Method + " " + r.URL.RequestURI() + " " + r.Header.Get("Accept")
}

// podOffline answers a pod's request without the cloud: the identity's
// own answer to the same read while its token is valid, else 503.
func (p *Proxy) podOffline(w http.ResponseWriter, r *http.Request, id podIdentity, known, read bool, why string) string {
	switch {
	case !known:
		refuse(w, why, "this token was never issued through this node to one of its pods: nothing is served for it offline")
		return podServedRefused
	case !p.clock.Now().Add(tokenMargin).Before(id.Expires):
		refuse(w, why, "the token of service account %s/%s expired at %s", id.Namespace, id.ServiceAccount, id.Expires.UTC().Format(time.RFC3339))
		return podServedRefused
	case !read:
		refuse(w, why, "%s %s of a pod is not possible offline (gets and lists read online are)", r.Method, r.URL.Path)
		return podServedRefused
	}
	e, err := p.podCache.Get(id.key(), podReadKey(r))
	switch {
	case err != nil:
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, nil, "tether-edge: %v", err)
		return podServedError
	case e == nil:
		refuse(w, why, "pod %s/%s never read %s online with this request", id.Namespace, id.Pod, r.URL.RequestURI())
		return podServedRefused
	}
	w.Header().Set("Content-Type", e.ContentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(e.Body)))
	w.WriteHeader(http.StatusOK)
	w.Write(e.Body)
	return podServedCache
}

// podUpstreamRequest is r for the current apiserver, with the pod's own
// Authorization header. The transport asks for gzip and inflates it, so
// that the answer kept is the one the client reads.
func (p *Proxy) podUpstreamRequest(r *http.Request) *http.Request {
	srv, _ := p.up.Server()
	out := r.Clone(r.Context())
	out.URL = &url.URL{Scheme: srv.Scheme, Host: srv.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	out.Host = ""
	out.RequestURI = ""
	for _, c := range r.Header.Values("Connection") {
		out.Header.Del(c)
	}
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	out.Header.Del("Accept-Encoding")
	return out
}

// newPodReverse is the reverse proxy of the pods' other requests
// (writes, watches, upgrades, tokens not in the ledger): the pod's own
// Authorization header passes, on the pods' transport.
func (p *Proxy) newPodReverse() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			srv, _ := p.up.Server()
			pr.SetURL(srv)
			pr.Out.Host = ""
		},
		Transport: p.podRT, FlushInterval: -1, ErrorHandler: p.proxyError,
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
}
