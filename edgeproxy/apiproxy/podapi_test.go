package apiproxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/testenv"
)

// podWorld is a real kube-apiserver, a proxy with its pod listener, the
// node registered, and two pods of the node, with service accounts
// reader and other (both may get and list ConfigMaps in workNS, neither
// Secrets), whose tokens the kubelet obtained through the proxy.
type podWorld struct {
	cp      *testenv.ControlPlane
	e       *edge
	offline *switchable
	tokenA  string // pod-a, service account reader
	tokenB  string // pod-b, service account other
	client  *http.Client
}

func startPodWorld(t *testing.T, dataDir string) *podWorld {
	t.Helper()
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const node = "edge-pods"
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	w := &podWorld{cp: cp, offline: &switchable{}}
	w.e = startEdge(t, edgeSpec{net: hostNet{}, server: cp.URL, node: node, cert: kp.TLS, ca: cp.CA, offline: w.offline, pods: true,
		dataDir: dataDir})
	w.e.waitHealthy(true, 30*time.Second)
	kubelet, _ := w.e.client(kubeletUA)
	if _, err := kubelet.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createWorkload(ctx, t, cp.Client, node, "pod-w") // cm-1, s-1, and a pod of the node that mounts them
	admin := cp.Client
	if _, err := admin.RbacV1().Roles(workNS).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "cm-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cp.CA.Pool()}}}
	t.Cleanup(w.client.CloseIdleConnections)
	for i, name := range []string{"pod-a", "pod-b"} {
		sa := []string{"reader", "other"}[i]
		if _, err := admin.CoreV1().ServiceAccounts(workNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.RbacV1().RoleBindings(workNS).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "cm-reader"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: workNS}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The volume the ServiceAccount admission injects, whose audience
		// NodeRestriction checks the kubelet's TokenRequest against.
		pod, err := admin.CoreV1().Pods(workNS).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}},
				Volumes: []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
					Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}}},
				}}}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The kubelet asks for the pod's kube-api-access token through
		// the proxy: the ledger the pod listener reads identities from.
		// (The Node authorizer learns the pod from its graph in a moment.)
		var tok string
		testenv.EventuallyNoError(t, "the kubelet's token for "+name, func() error {
			resp, body := askToken(t, w.e.Addr, kubeletUA, workNS, sa, tokenRequest(name, pod.UID), true)
			if resp.StatusCode != http.StatusCreated {
				return fmt.Errorf("%s %s", resp.Status, body)
			}
			tok = tokenOfAnswer(t, resp, body)
			return nil
		})
		if i == 0 {
			w.tokenA = tok
		} else {
			w.tokenB = tok
		}
	}
	return w
}

// get asks the pod listener for path with token (none if empty) and a
// User-Agent.
func (w *podWorld) get(t *testing.T, token, ua, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "https://"+w.e.PodAddr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("User-Agent", ua)
	req.Header.Set("Accept", "application/json")
	resp, err := w.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const (
	podUA         = "reader-app/1.0"
	configMapList = "/api/v1/namespaces/" + workNS + "/configmaps"
	configMapGet  = configMapList + "/cm-1"
	secretGet     = "/api/v1/namespaces/" + workNS + "/secrets/s-1"
)

// TestPodCacheIsolation: offline, a pod's token is served only what that
// same identity read online, byte for byte; another pod's reads of the
// same URL, a token the cloud issued but not through this node, an
// expired token, a watch and a write are refused (503); no token is 401.
func TestPodCacheIsolation(t *testing.T) {
	w := startPodWorld(t, "")
	ctx := context.Background()
	if code, body := w.get(t, "", podUA, configMapList); code != http.StatusUnauthorized {
		t.Errorf("no token: %d %s, want 401", code, body)
	}
	code, discoveryA := w.get(t, w.tokenA, podUA, "/api/v1")
	if code != http.StatusOK || !strings.Contains(discoveryA, `"configmaps"`) {
		t.Fatalf("pod-a's discovery online: %d %s", code, discoveryA)
	}
	code, listA := w.get(t, w.tokenA, podUA, configMapList)
	if code != http.StatusOK || !strings.Contains(listA, `"cm-1"`) {
		t.Fatalf("pod-a lists ConfigMaps online: %d %s", code, listA)
	}
	if code, body := w.get(t, w.tokenB, podUA, configMapGet); code != http.StatusOK {
		t.Fatalf("pod-b gets cm-1 online: %d %s", code, body)
	}
	// A token of reader the cloud issued, not through this node's
	// kubelet: relayed online (the cloud authenticates it), not cached.
	pod, err := w.cp.Client.CoreV1().Pods(workNS).Get(ctx, "pod-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := w.cp.Client.CoreV1().ServiceAccounts(workNS).CreateToken(ctx, "reader", tokenRequest("pod-a", pod.UID), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unknown := tr.Status.Token
	if code, body := w.get(t, unknown, podUA, configMapList); code != http.StatusOK {
		t.Fatalf("a token not in the ledger, online: %d %s, want the cloud's answer", code, body)
	}
	if code, _ := w.get(t, "not-a-token", podUA, configMapList); code != http.StatusUnauthorized {
		t.Errorf("a made-up token online: %d, want the cloud's 401", code)
	}
	// (Counted once the handler returns, just after the client's answer.)
	testenv.Eventually(t, "5 pod requests served by the cloud", func() bool {
		return w.e.metric("tether_edge_pod_api_requests_total", "served", "cloud") == 5
	})

	w.offline.set(true)
	if code, body := w.get(t, w.tokenA, podUA, configMapList); code != http.StatusOK || body != listA {
		t.Errorf("pod-a's list offline: %d, want 200 with the bytes it got online\n%s", code, body)
	}
	if code, body := w.get(t, w.tokenB, podUA, configMapList); code != http.StatusServiceUnavailable {
		t.Errorf("pod-b's list offline, which only pod-a read: %d %s, want 503", code, body)
	}
	if code, body := w.get(t, w.tokenA, podUA, "/api/v1"); code != http.StatusOK || body != discoveryA {
		t.Errorf("pod-a's discovery offline: %d, want 200 with the bytes it got online", code)
	}
	if code, _ := w.get(t, w.tokenB, podUA, "/api/v1"); code != http.StatusServiceUnavailable {
		t.Errorf("pod-b's discovery offline, which only pod-a read: %d, want 503", code)
	}
	if code, _ := w.get(t, w.tokenB, podUA, configMapGet); code != http.StatusOK {
		t.Errorf("pod-b's own get offline: %d, want 200", code)
	}
	if code, _ := w.get(t, w.tokenA, podUA, configMapGet); code != http.StatusServiceUnavailable {
		t.Errorf("pod-a's get offline, which only pod-b read: %d, want 503", code)
	}
	if code, _ := w.get(t, unknown, podUA, configMapList); code != http.StatusServiceUnavailable {
		t.Errorf("a token not in the ledger, offline: %d, want 503", code)
	}
	if code, _ := w.get(t, "", podUA, configMapList); code != http.StatusUnauthorized {
		t.Errorf("no token offline: %d, want 401", code)
	}
	if code, _ := w.get(t, w.tokenA, podUA, configMapList+"?watch=true"); code != http.StatusServiceUnavailable {
		t.Errorf("a watch offline: %d, want 503", code)
	}
	testenv.Eventually(t, "3 pod requests served from the cache", func() bool {
		return w.e.metric("tether_edge_pod_api_requests_total", "served", "cache") == 3
	})
	// pod-a's token expires (by the edge's clock): its reads go.
	w.e.Proxy.podIDs.mu.Lock()
	for h, id := range w.e.Proxy.podIDs.byHash {
		if id.Pod == "pod-a" {
			id.Expires = time.Now().Add(tokenMargin / 2)
			w.e.Proxy.podIDs.byHash[h] = id
		}
	}
	w.e.Proxy.podIDs.mu.Unlock()
	if code, body := w.get(t, w.tokenA, podUA, configMapList); code != http.StatusServiceUnavailable || !strings.Contains(body, "expired") {
		t.Errorf("pod-a's list offline, its token expired: %d %s, want 503", code, body)
	}

	// A restarted tether-edge knows the identities from the ledger.
	w.offline.set(false)
	w.e = w.e.restart()
	w.offline = w.e.spec.offline
	w.offline.set(true)
	if code, body := w.get(t, w.tokenB, podUA, configMapGet); code != http.StatusOK {
		t.Errorf("pod-b's get offline after a restart: %d %s, want 200", code, body)
	}
}

// TestPodUserAgentIgnored: a pod that says it is the kubelet is still
// its token's identity: online the cloud answers its token (not the
// node's identity: a Secret the node may read is forbidden to it);
// offline it gets its own reads and never the kubelet's cached Secret.
func TestPodUserAgentIgnored(t *testing.T) {
	w := startPodWorld(t, "")
	ctx := context.Background()
	kubelet, _ := w.e.client(kubeletUA)
	if _, err := kubelet.CoreV1().Secrets(workNS).Get(ctx, "s-1", metav1.GetOptions{}); err != nil {
		t.Fatalf("the kubelet reads the Secret of its pod: %v", err)
	}
	if code, body := w.get(t, w.tokenA, kubeletUA, secretGet); code != http.StatusForbidden {
		t.Fatalf("a pod saying it is kubelet gets the Secret online: %d %s, want the cloud's 403 to its token", code, body)
	}
	if code, body := w.get(t, w.tokenA, kubeletUA, configMapList); code != http.StatusOK {
		t.Fatalf("a pod saying it is kubelet lists ConfigMaps online: %d %s", code, body)
	}
	if code, _ := w.get(t, "", kubeletUA, secretGet); code != http.StatusUnauthorized {
		t.Errorf("no token, as kubelet: %d, want 401", code)
	}

	w.offline.set(true)
	if code, body := w.get(t, w.tokenA, kubeletUA, secretGet); code != http.StatusServiceUnavailable {
		t.Errorf("offline, a pod saying it is kubelet gets the Secret: %d %s, want 503", code, body)
	}
	if code, _ := w.get(t, w.tokenA, kubeletUA, configMapList); code != http.StatusOK {
		t.Errorf("offline, the pod's own list: %d, want 200", code)
	}
	if _, err := kubelet.CoreV1().Secrets(workNS).Get(ctx, "s-1", metav1.GetOptions{}); err != nil {
		t.Errorf("offline, the kubelet's own Secret from its cache: %v", err)
	}
}

// TestKubeletSeesPodListener: with the pod listener on, the kubelet's
// lists and watches of Services show default/kubernetes at the node's
// pod listener (online, and offline from its cache); kube-proxy sees the
// real Service.
func TestKubeletSeesPodListener(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const node = "edge-svc"
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	offline := &switchable{}
	e := startEdge(t, edgeSpec{net: hostNet{}, server: cp.URL, node: node, cert: kp.TLS, ca: cp.CA, offline: offline,
		pods: true, podService: []string{"192.0.2.10"}})
	e.waitHealthy(true, 30*time.Second)
	_, port, _ := strings.Cut(e.PodAddr, ":")
	var real *corev1.Service
	testenv.EventuallyNoError(t, "kube-apiserver's default/kubernetes", func() (err error) { // made just after it starts
		real, err = cp.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		return err
	})
	kubelet, _ := e.client(kubeletUA)
	kubeProxy, _ := e.client("kube-proxy/v1.36.3")
	check := func(what string, c interface {
		List(context.Context, metav1.ListOptions) (*corev1.ServiceList, error)
	}, wantIP, wantPort string) {
		t.Helper()
		// (Offline: once the online answer reached the cache, in the
		// background.)
		testenv.EventuallyNoError(t, what, func() error {
			list, err := c.List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			for _, s := range list.Items {
				if s.Namespace != "default" || s.Name != "kubernetes" {
					continue
				}
				if s.Spec.ClusterIP != wantIP || len(s.Spec.ClusterIPs) != 1 || s.Spec.ClusterIPs[0] != wantIP ||
					len(s.Spec.Ports) != 1 || fmt.Sprint(s.Spec.Ports[0].Port) != wantPort {
					t.Fatalf("%s: default/kubernetes at %v %v, want %s:%s", what, s.Spec.ClusterIPs, s.Spec.Ports, wantIP, wantPort)
				}
				return nil
			}
			return fmt.Errorf("%s: no default/kubernetes", what)
		})
	}
	check("the kubelet's list", kubelet.CoreV1().Services(""), "192.0.2.10", port)
	check("kube-proxy's list", kubeProxy.CoreV1().Services(""), real.Spec.ClusterIP, "443")
	// The kubelet's watch (client-go's watch-list: the initial events).
	w, err := kubelet.CoreV1().Services("default").Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=kubernetes", ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.ResultChan():
		s, ok := ev.Object.(*corev1.Service)
		if !ok || s.Spec.ClusterIP != "192.0.2.10" || fmt.Sprint(s.Spec.Ports[0].Port) != port {
			t.Errorf("the kubelet's watch: %v %#v", ev.Type, ev.Object)
		}
	case <-time.After(testenv.WaitBound):
		t.Error("no event on the kubelet's watch")
	}
	w.Stop()

	offline.set(true)
	check("the kubelet's list offline", kubelet.CoreV1().Services(""), "192.0.2.10", port)
	check("kube-proxy's list offline", kubeProxy.CoreV1().Services(""), real.Spec.ClusterIP, "443")
}

// TestPodCacheDiskFull: with the disk full, a pod's read is answered
// online and the failure to keep it counted; offline it is refused, never
// answered from a half-written entry.
func TestPodCacheDiskFull(t *testing.T) {
	dir := mountTmpfs(t, 8<<20)
	w := startPodWorld(t, dir)
	ctx := context.Background()
	// A list too large for the free pages of the file: the write must
	// grow it.
	if _, err := w.cp.Client.CoreV1().ConfigMaps(workNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "big"},
		Data: map[string]string{"k": strings.Repeat("x", 512<<10)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fill(t, dir)
	if code, body := w.get(t, w.tokenA, podUA, configMapList); code != http.StatusOK || !strings.Contains(body, `"big"`) {
		t.Fatalf("pod-a's list online, disk full: %d, want the cloud's answer", code)
	}
	testenv.Eventually(t, "the failed write counted", func() bool {
		return w.e.metric("tether_edge_pod_api_cache_failures_total") >= 1
	})
	w.offline.set(true)
	if code, body := w.get(t, w.tokenA, podUA, configMapList); code != http.StatusServiceUnavailable {
		t.Errorf("pod-a's list offline, never kept: %d %.200s, want 503", code, body)
	}
}

func TestIsDiscovery(t *testing.T) {
	for path, want := range map[string]bool{
		"/version": true, "/api": true, "/api/v1": true, "/apis": true, "/apis/apps": true, "/apis/apps/v1": true,
		"/": false, "/version/x": false, "/api/v1/namespaces": false, "/apis/apps/v1/deployments": false,
		"/api/v1/namespaces/a/services/s/proxy/x": false, "/openapi/v2": false, "/healthz": false,
		"/api//v1": false, "/api/v1?watch=true": false,
	} {
		r, err := http.NewRequest(http.MethodGet, "https://node:10268"+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := isDiscovery(r); got != want {
			t.Errorf("isDiscovery(%s) = %v, want %v", path, got, want)
		}
	}
}
