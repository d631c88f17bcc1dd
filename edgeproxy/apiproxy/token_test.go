package apiproxy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/testenv"
)

const protobufAccept = "application/vnd.kubernetes.protobuf,application/json"

// fakeJWT is an unsigned JWT whose payload says exp (and a pod UID):
// what the proxy reads of a token.
func fakeJWT(exp time.Time, uid string) string {
	enc := base64.RawURLEncoding.EncodeToString
	payload, _ := json.Marshal(map[string]any{"exp": exp.Unix(), "kubernetes.io": map[string]any{"pod": map[string]string{"uid": uid}}})
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc(payload) + "." + enc([]byte("signature"))
}

// tokenServer is an apiserver that answers /readyz and TokenRequests:
// 201 with the request's spec and a token that expires after life (the
// status says an hour), in protobuf when the client takes it.
type tokenServer struct {
	*httptest.Server
	mu     sync.Mutex
	life   time.Duration
	issued int
}

func newTokenServer(t *testing.T) *tokenServer {
	f := &tokenServer{life: 365 * 24 * time.Hour}
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			w.Write([]byte("ok"))
			return
		}
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/token") {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		j, err := bodyJSON(r.Header.Get("Content-Type"), body)
		var tr authenticationv1.TokenRequest
		if err == nil {
			err = json.Unmarshal(j, &tr)
		}
		if err != nil || tr.Spec.BoundObjectRef == nil {
			http.Error(w, fmt.Sprint("bad request: ", err), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		life := f.life
		f.issued++
		n := f.issued
		f.mu.Unlock()
		now := time.Now()
		tr.TypeMeta = metav1.TypeMeta{Kind: "TokenRequest", APIVersion: "authentication.k8s.io/v1"}
		tr.CreationTimestamp = metav1.NewTime(now)
		tr.Status = authenticationv1.TokenRequestStatus{Token: fakeJWT(now.Add(life), string(tr.Spec.BoundObjectRef.UID)) + fmt.Sprint(n),
			ExpirationTimestamp: metav1.NewTime(now.Add(time.Hour))}
		var out bytes.Buffer
		ct := runtime.ContentTypeJSON
		if strings.Contains(r.Header.Get("Accept"), runtime.ContentTypeProtobuf) {
			ct = runtime.ContentTypeProtobuf
			err = protobuf.Serializer.Encode(&tr, &out)
		} else {
			err = json.NewEncoder(&out).Encode(&tr)
		}
		if err != nil {
			t.Errorf("encode the answer: %v", err)
		}
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(http.StatusCreated)
		w.Write(out.Bytes())
	}))
	f.EnableHTTP2 = true
	f.StartTLS()
	t.Cleanup(f.Close)
	return f
}

func (f *tokenServer) setLife(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.life = d
}

// tokenRequest is the TokenRequest kubelet sends for a pod's projected
// kube-api-access volume.
func tokenRequest(pod string, uid types.UID, audiences ...string) *authenticationv1.TokenRequest {
	return &authenticationv1.TokenRequest{
		TypeMeta: metav1.TypeMeta{Kind: "TokenRequest", APIVersion: "authentication.k8s.io/v1"},
		Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: ptr.To[int64](3607),
			BoundObjectRef: &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod, UID: uid}},
	}
}

// askToken posts tr for service account sa in ns through the proxy at
// addr as ua, in protobuf (as kubelet does) or JSON.
func askToken(t *testing.T, addr, ua, ns, sa string, tr *authenticationv1.TokenRequest, proto bool) (*http.Response, []byte) {
	t.Helper()
	var body bytes.Buffer
	ct, accept := runtime.ContentTypeJSON, runtime.ContentTypeJSON
	var err error
	if proto {
		ct, accept = runtime.ContentTypeProtobuf, protobufAccept
		err = protobuf.Serializer.Encode(tr, &body)
	} else {
		err = json.NewEncoder(&body).Encode(tr)
	}
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", fmt.Sprintf("http://%s/api/v1/namespaces/%s/serviceaccounts/%s/token", addr, ns, sa), &body)
	req.Header.Set("Content-Type", ct)
	req.Header.Set("Accept", accept)
	req.Header.Set("User-Agent", ua)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// tokenOfAnswer reads the token out of an answer.
func tokenOfAnswer(t *testing.T, resp *http.Response, b []byte) string {
	t.Helper()
	j, err := bodyJSON(resp.Header.Get("Content-Type"), b)
	if err != nil {
		t.Fatalf("answer %s: %v", resp.Status, err)
	}
	var tr authenticationv1.TokenRequest
	if err := json.Unmarshal(j, &tr); err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// refusedOffline checks a 503 ServiceUnavailable whose message says want.
func refusedOffline(t *testing.T, what string, resp *http.Response, b []byte, want string) {
	t.Helper()
	var st metav1.Status
	if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(b, &st) != nil ||
		st.Reason != metav1.StatusReasonServiceUnavailable || !strings.Contains(st.Message, want) {
		t.Errorf("%s: %s %s, want 503 saying %q", what, resp.Status, b, want)
	}
}

func tokenEdge(t *testing.T, f *tokenServer, offline *switchable) *edge {
	t.Helper()
	kp, _ := testenv.MustCA(t, "unit").NodeCert("n")
	e := startEdge(t, edgeSpec{net: hostNet{}, server: f.URL, node: "n", cert: kp.TLS, offline: offline,
		rootCAs: f.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs})
	e.waitHealthy(true, 10*time.Second)
	return e
}

// Offline, a kubelet gets the last token the cloud issued for the same
// request, byte for byte, in protobuf or JSON; its TokenRequests online
// reach the cloud every time.
func TestTokenServedOffline(t *testing.T) {
	f := newTokenServer(t)
	offline := &switchable{}
	e := tokenEdge(t, f, offline)
	tr := tokenRequest("p", "uid-1")
	online, onlineBody := askToken(t, e.Addr, kubeletUA, "ns", "default", tr, true)
	if online.StatusCode != http.StatusCreated || online.Header.Get("Content-Type") != runtime.ContentTypeProtobuf {
		t.Fatalf("online: %s %s %s", online.Status, online.Header.Get("Content-Type"), onlineBody)
	}
	again, againBody := askToken(t, e.Addr, kubeletUA, "ns", "default", tr, true)
	if again.StatusCode != http.StatusCreated || bytes.Equal(againBody, onlineBody) {
		t.Fatalf("online again: %s, the same answer: the cloud was not asked", again.Status)
	}
	if n := e.metric("tether_edge_apiserver_tokens_stored_total", "component", "kubelet"); n != 2 {
		t.Errorf("tokens stored: %v, want 2", n)
	}
	if n := e.Store.TokenCount()["kubelet"]; n != 1 {
		t.Errorf("%d tokens kept, want the latest only", n)
	}

	offline.set(true)
	resp, body := askToken(t, e.Addr, kubeletUA, "ns", "default", tr, true)
	if resp.StatusCode != http.StatusCreated || !bytes.Equal(body, againBody) || resp.Header.Get("Content-Type") != runtime.ContentTypeProtobuf {
		t.Errorf("offline: %s %s, want 201 with the cloud's last answer, as it was", resp.Status, resp.Header.Get("Content-Type"))
	}
	resp, body = askToken(t, e.Addr, kubeletUA, "ns", "default", tr, false)
	if resp.StatusCode != http.StatusCreated || tokenOfAnswer(t, resp, body) != tokenOfAnswer(t, again, againBody) {
		t.Errorf("offline in JSON: %s %s", resp.Status, body)
	}
	if n := e.metric("tether_edge_apiserver_tokens_served_offline_total", "component", "kubelet"); n != 2 {
		t.Errorf("served offline: %v, want 2", n)
	}
	if n := e.metric("tether_edge_apiserver_requests_total", "component", "kubelet", "verb", "create", "served", "cache"); n != 2 {
		t.Errorf("requests served from the cache: %v, want 2", n)
	}
	if strings.Contains(e.logs.String(), tokenOfAnswer(t, again, againBody)) {
		t.Error("a token in the logs")
	}
}

// A token bound to one pod UID is never served for another: the pod of
// that name was recreated, or the cloud never issued a token for it. The
// refusal is a 503, never a 404 (kubelet would remember that the
// TokenRequest API is not there).
func TestTokenNeverServedForAnotherPodUID(t *testing.T) {
	f := newTokenServer(t)
	offline := &switchable{}
	e := tokenEdge(t, f, offline)
	if resp, b := askToken(t, e.Addr, kubeletUA, "ns", "default", tokenRequest("p", "uid-1"), true); resp.StatusCode != http.StatusCreated {
		t.Fatalf("online: %s %s", resp.Status, b)
	}
	offline.set(true)
	resp, b := askToken(t, e.Addr, kubeletUA, "ns", "default", tokenRequest("p", "uid-2"), true)
	refusedOffline(t, "another uid", resp, b, "only for uid uid-1")
	resp, b = askToken(t, e.Addr, kubeletUA, "ns", "default", tokenRequest("q", "uid-1"), true)
	refusedOffline(t, "another pod name", resp, b, "never issued")
	resp, b = askToken(t, e.Addr, kubeletUA, "ns", "other", tokenRequest("p", "uid-1"), true)
	refusedOffline(t, "another service account", resp, b, "never issued")
	resp, b = askToken(t, e.Addr, kubeletUA, "ns", "default", tokenRequest("p", "uid-1", "vault"), true)
	refusedOffline(t, "another audience", resp, b, "never issued")
	if n := e.metric("tether_edge_apiserver_tokens_refused_offline_total", "component", "kubelet", "reason", "other_uid"); n != 1 {
		t.Errorf("refused for another uid: %v, want 1", n)
	}
	if n := e.metric("tether_edge_apiserver_tokens_refused_offline_total", "component", "kubelet", "reason", "missing"); n != 3 {
		t.Errorf("refused as missing: %v, want 3", n)
	}
	if logged := e.records.find(slog.LevelInfo, "no service-account token for this pod UID offline; the cloud issued one for another pod of that name"); len(logged) != 1 ||
		logged[0]["uid"] != "uid-2" || logged[0]["issued_for_uids"] != "uid-1" {
		t.Errorf("the other uid logged: %v", logged)
	}
	askToken(t, e.Addr, kubeletUA, "ns", "default", tokenRequest("p", "uid-2"), true)
	if logged := e.records.find(slog.LevelInfo, "no service-account token for this pod UID offline; the cloud issued one for another pod of that name"); len(logged) != 1 {
		t.Errorf("logged %d times, want once", len(logged))
	}
}

// A token whose JWT expires (within the margin) is not served offline;
// the refusal says when it expired.
func TestTokenNeverServedExpired(t *testing.T) {
	f := newTokenServer(t)
	offline := &switchable{}
	e := tokenEdge(t, f, offline)
	f.setLife(10 * time.Second) // within tokenMargin
	if resp, b := askToken(t, e.Addr, kubeletUA, "ns", "default", tokenRequest("p", "uid-1", "vault"), true); resp.StatusCode != http.StatusCreated {
		t.Fatalf("online: %s %s", resp.Status, b)
	}
	f.setLife(time.Hour) // its status says an hour too: the JWT's exp decides
	if resp, b := askToken(t, e.Addr, kubeletUA, "ns", "default", tokenRequest("p", "uid-1"), true); resp.StatusCode != http.StatusCreated {
		t.Fatalf("online: %s %s", resp.Status, b)
	}
	offline.set(true)
	resp, b := askToken(t, e.Addr, kubeletUA, "ns", "default", tokenRequest("p", "uid-1", "vault"), true)
	refusedOffline(t, "expired", resp, b, "expired at")
	if n := e.metric("tether_edge_apiserver_tokens_refused_offline_total", "component", "kubelet", "reason", "expired"); n != 1 {
		t.Errorf("refused as expired: %v, want 1", n)
	}
	if resp, b := askToken(t, e.Addr, kubeletUA, "ns", "default", tokenRequest("p", "uid-1"), true); resp.StatusCode != http.StatusCreated {
		t.Errorf("the valid one: %s %s", resp.Status, b)
	}
}

// A component that did not receive a token online cannot get it offline:
// tokens are kept per component, and only for the cached components.
func TestTokenNotServedToAnotherComponent(t *testing.T) {
	f := newTokenServer(t)
	offline := &switchable{}
	e := tokenEdge(t, f, offline)
	tr := tokenRequest("p", "uid-1")
	if resp, b := askToken(t, e.Addr, kubeletUA, "ns", "default", tr, true); resp.StatusCode != http.StatusCreated {
		t.Fatalf("online: %s %s", resp.Status, b)
	}
	if resp, b := askToken(t, e.Addr, "kubectl/v1.36", "ns", "default", tr, true); resp.StatusCode != http.StatusCreated {
		t.Fatalf("kubectl online: %s %s", resp.Status, b)
	}
	if c := e.Store.TokenCount(); c["kubectl"] != 0 || c["kubelet"] != 1 {
		t.Errorf("tokens kept: %v, want kubelet's only", c)
	}
	offline.set(true)
	resp, b := askToken(t, e.Addr, "kube-proxy/v1.36", "ns", "default", tr, true)
	refusedOffline(t, "kube-proxy", resp, b, "never issued a token of service account default to kube-proxy")
	resp, b = askToken(t, e.Addr, "kubectl/v1.36", "ns", "default", tr, true)
	refusedOffline(t, "kubectl", resp, b, "not possible offline")
	if resp, b := askToken(t, e.Addr, kubeletUA, "ns", "default", tr, true); resp.StatusCode != http.StatusCreated {
		t.Errorf("kubelet offline: %s %s", resp.Status, b)
	}
}

func TestJWTExpiry(t *testing.T) {
	at := time.Unix(1893456000, 0)
	if got, ok := jwtExpiry(fakeJWT(at, "u")); !ok || !got.Equal(at) {
		t.Errorf("jwtExpiry = %v %v", got, ok)
	}
	for _, bad := range []string{"", "a.b", "a.!!!.c", "a." + base64.RawURLEncoding.EncodeToString([]byte(`{"iat":1}`)) + ".c"} {
		if _, ok := jwtExpiry(bad); ok {
			t.Errorf("jwtExpiry(%q) ok", bad)
		}
	}
}
