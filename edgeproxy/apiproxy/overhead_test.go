package apiproxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edgeproxy/cache"

	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/internal/testenv"
)

// BenchmarkProxyGetOverhead measures what the proxy itself adds to a GET
// of a pod (protobuf, as kubelet asks): a client on loopback, the proxy
// in process, an apiserver stand-in that answers at once; and, for
// comparison, what net/http/httputil's ReverseProxy adds in its place.
func BenchmarkProxyGetOverhead(b *testing.B) {
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", ResourceVersion: "7", Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}}}}
	var pb bytes.Buffer
	if err := protobuf.Serializer.Encode(pod, &pb); err != nil {
		b.Fatal(err)
	}
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			w.Write([]byte("ok"))
			return
		}
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
		w.Write(pb.Bytes())
	}))
	api.EnableHTTP2 = true
	api.StartTLS()
	defer api.Close()
	kp, _ := testenv.MustCA(b, "bench").NodeCert("n")
	e := startEdge(b, edgeSpec{net: hostNet{}, server: api.URL, node: "n", cert: kp.TLS,
		rootCAs: api.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs})
	e.waitHealthy(true, 10*time.Second)

	// The floor of any such hop: the standard library's reverse proxy,
	// HTTP/1.1 in and HTTP/2 with TLS out, doing nothing else.
	target, _ := url.Parse(api.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = api.Client().Transport
	rpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	rpSrv := &http.Server{Handler: rp}
	go rpSrv.Serve(rpLn)
	defer rpSrv.Close()

	for _, tc := range []struct{ name, url string }{
		{"direct", api.URL + "/api/v1/namespaces/ns/pods/p"},
		{"proxy", "http://" + e.Addr + "/api/v1/namespaces/ns/pods/p"},
		{"httputil.ReverseProxy", "http://" + rpLn.Addr().String() + "/api/v1/namespaces/ns/pods/p"},
	} {
		client := api.Client()
		if tc.name != "direct" {
			client = &http.Client{}
		}
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				req, _ := http.NewRequest("GET", tc.url, nil)
				req.Header.Set("User-Agent", kubeletUA)
				req.Header.Set("Accept", "application/vnd.kubernetes.protobuf,application/json")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

// BenchmarkOfflineList serves a list of 1,000 pods (spec.nodeName
// selector) from the cache, offline, to a client that reads the bytes
// without decoding them: the proxy's own cost.
func BenchmarkOfflineList(b *testing.B) {
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	api.EnableHTTP2 = true
	api.StartTLS()
	defer api.Close()
	kp, _ := testenv.MustCA(b, "bench").NodeCert("n")
	offline := &switchable{}
	e := startEdge(b, edgeSpec{net: hostNet{}, server: api.URL, node: "n", cert: kp.TLS, offline: offline,
		rootCAs: api.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs})
	e.waitHealthy(true, 10*time.Second)
	list := cacheList1000(b)
	if err := e.Store.ApplyList("kubelet", podsGVR, list); err != nil {
		b.Fatal(err)
	}
	e.Store.Sync()
	offline.set(true)
	url := "http://" + e.Addr + "/api/v1/pods?fieldSelector=spec.nodeName%3Dn"
	b.ResetTimer()
	for b.Loop() {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("User-Agent", kubeletUA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			b.Fatal(err, resp.Status)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func cacheList1000(b *testing.B) cache.List {
	l := cache.List{Kind: "Pod", APIVersion: "v1", RV: 5000, Complete: true}
	for i := range 1000 {
		p := &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%04d", i), Namespace: "bench", UID: types.UID(fmt.Sprint("uid-", i)),
				ResourceVersion: fmt.Sprint(1000 + i), Labels: map[string]string{"app": fmt.Sprint("app-", i%20), "tier": "bench"}},
			Spec: corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1",
				Env: []corev1.EnvVar{{Name: "INDEX", Value: fmt.Sprint(i)}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3",
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
		raw, _ := json.Marshal(p)
		o, err := localapi.DecodeObject(raw, "", "")
		if err != nil {
			b.Fatal(err)
		}
		l.Items = append(l.Items, o)
	}
	return l
}
