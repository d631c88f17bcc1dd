package apiproxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/internal/testenv"
)

func TestComponent(t *testing.T) {
	for ua, want := range map[string]string{
		"kubelet/v1.36.3 (linux/amd64) kubernetes/abc": "kubelet",
		"kube-proxy/v1.36.3 (linux/arm64)":             "kube-proxy",
		"CoreDNS/1.12":                                 "coredns",
		"flanneld":                                     "flanneld",
		"":                                             "",
	} {
		if got := component(ua); got != want {
			t.Errorf("component(%q) = %q, want %q", ua, got, want)
		}
	}
}

// kubelet sends its Lease as protobuf: the proxy reads it offline.
func TestBodyJSONFromProtobuf(t *testing.T) {
	lease := &coordinationv1.Lease{
		TypeMeta:   metav1.TypeMeta{Kind: "Lease", APIVersion: "coordination.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "kube-node-lease", ResourceVersion: "41"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("n")},
	}
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	var pb bytes.Buffer
	if err := info.Serializer.Encode(lease, &pb); err != nil {
		t.Fatal(err)
	}
	j, err := bodyJSON(runtime.ContentTypeProtobuf, pb.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	var got coordinationv1.Lease
	if err := json.Unmarshal(j, &got); err != nil || got.Kind != "Lease" || got.ResourceVersion != "41" || *got.Spec.HolderIdentity != "n" {
		t.Errorf("JSON %s: %v", j, err)
	}
	bumped, _ := localapi.WithResourceVersion(j, 42, "", "")
	if !bytes.Contains(bumped, []byte(`"resourceVersion":"42"`)) {
		t.Errorf("not bumped: %s", bumped)
	}
	if _, err := bodyJSON("application/cbor", []byte{0xa0}); err == nil {
		t.Error("cbor read")
	}
}

// fakeAPIServer is an apiserver that answers /readyz, a pod list, and
// upgrades of ".../exec" to an echo protocol; it records the headers it
// was sent.
type fakeAPIServer struct {
	*httptest.Server
	mu      sync.Mutex
	headers map[string]http.Header // by User-Agent
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	f := &fakeAPIServer{headers: map[string]http.Header{}}
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.headers[r.UserAgent()] = r.Header.Clone()
		f.headers[r.UserAgent()].Set("X-Test-Proto", strconv.Itoa(r.ProtoMajor))
		f.mu.Unlock()
		switch {
		case r.URL.Path == "/readyz":
			w.Write([]byte("ok"))
		case strings.HasSuffix(r.URL.Path, "/exec") && r.Header.Get("Upgrade") == "tether-echo":
			conn, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			defer conn.Close()
			rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tether-echo\r\n\r\n")
			rw.Flush()
			io.Copy(conn, rw)
		case r.URL.Path == "/api/v1/namespaces/ns/pods":
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[{"metadata":{"name":"p","namespace":"ns","resourceVersion":"8"}}]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	f.EnableHTTP2 = true
	f.StartTLS()
	t.Cleanup(f.Close)
	return f
}

func (f *fakeAPIServer) header(ua string) http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.headers[ua]
}

// edgeFor starts the proxy in this namespace against a fake apiserver.
func edgeFor(t *testing.T, f *fakeAPIServer, offline *switchable) *edge {
	t.Helper()
	kp, _ := testenv.MustCA(t, "unit").NodeCert("n")
	e := startEdge(t, edgeSpec{net: hostNet{}, server: f.URL, node: "n", cert: kp.TLS, offline: offline,
		rootCAs: f.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs})
	e.waitHealthy(true, 10*time.Second)
	return e
}

func TestUpstreamRequests(t *testing.T) {
	f := newFakeAPIServer(t)
	offline := &switchable{}
	e := edgeFor(t, f, offline)

	getPath := func(path, ua, accept string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+e.Addr+path, nil)
		req.Header.Set("User-Agent", ua)
		req.Header.Set("Accept", accept)
		req.Header.Set("Authorization", "Bearer client-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	get := func(ua, accept string) *http.Response { return getPath("/api/v1/namespaces/ns/pods", ua, accept) }
	// A cached component gets protobuf where the proxy reads it, JSON
	// elsewhere; the client's credentials never go upstream.
	get(kubeletUA, "application/vnd.kubernetes.protobuf,application/json")
	if h := f.header(kubeletUA); h.Get("Accept") != "application/vnd.kubernetes.protobuf,application/json" || h.Get("Authorization") != "" {
		t.Errorf("kubelet's request upstream: Accept %q, Authorization %q", h.Get("Accept"), h.Get("Authorization"))
	}
	getPath("/apis/example.com/v1/namespaces/ns/widgets", kubeletUA, "application/vnd.kubernetes.protobuf,application/json")
	if h := f.header(kubeletUA); h.Get("Accept") != "application/json" {
		t.Errorf("kubelet's request for a group the proxy cannot read: Accept %q", h.Get("Accept"))
	}
	get(kubeletUA, "application/vnd.kubernetes.protobuf,application/json") // for the cache check below
	// Gets and lists go over HTTP/1.1 connections of their own once one
	// is made (package upstream, Reads), watches over HTTP/2.
	testenv.EventuallyNoError(t, "a list over HTTP/1.1", func() error {
		get(kubeletUA, "application/json")
		if p := f.header(kubeletUA).Get("X-Test-Proto"); p != "1" {
			return fmt.Errorf("kubelet's list went over HTTP/%s", p)
		}
		return nil
	})
	getPath("/api/v1/namespaces/ns/pods?watch=true", "kube-proxy/v1.36", "application/json")
	if p := f.header("kube-proxy/v1.36").Get("X-Test-Proto"); p != "2" {
		t.Errorf("kube-proxy's watch went over HTTP/%s, want 2", p)
	}
	// Others are relayed as they are (but for Authorization).
	get("kubectl/v1.36", "application/vnd.kubernetes.protobuf")
	if h := f.header("kubectl/v1.36"); h.Get("Accept") != "application/vnd.kubernetes.protobuf" || h.Get("Authorization") != "" {
		t.Errorf("kubectl's request upstream: Accept %q, Authorization %q", h.Get("Accept"), h.Get("Authorization"))
	}
	testenv.EventuallyNoError(t, "the pod cached", func() error {
		if o, _ := e.Store.Get("kubelet", podsGVR, "ns", "p"); o == nil {
			return io.ErrUnexpectedEOF
		}
		return nil
	})

	// Upgrades (exec, attach, port-forward) pass through over HTTP/1.1.
	upgrade := func() (*http.Response, net.Conn, *bufio.Reader) {
		conn, err := net.Dial("tcp", e.Addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, "POST /api/v1/namespaces/ns/pods/p/exec?command=sh HTTP/1.1\r\nHost: x\r\nUser-Agent: kubectl/v1.36\r\nConnection: Upgrade\r\nUpgrade: tether-echo\r\n\r\n")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp, conn, br
	}
	resp, conn, br := upgrade()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	io.WriteString(conn, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Errorf("echo through the upgraded connection: %q %v", line, err)
	}
	conn.Close()

	// Offline, an upgrade is refused with a clear Status.
	offline.set(true)
	resp, conn, _ = upgrade()
	defer conn.Close()
	body, _ := io.ReadAll(resp.Body)
	var st metav1.Status
	if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(body, &st) != nil ||
		st.Reason != metav1.StatusReasonServiceUnavailable || !strings.Contains(st.Message, "unreachable") {
		t.Errorf("offline upgrade: %s %s", resp.Status, body)
	}
	// kubelet's list is answered from the cache, kubectl's refused.
	if r := get(kubeletUA, "application/json"); r.StatusCode != http.StatusOK {
		t.Errorf("offline kubelet list: %s", r.Status)
	}
	if r := get("kubectl/v1.36", "application/json"); r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("offline kubectl list: %s", r.Status)
	}
}
