package apiproxy

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	edgecache "github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestTokenAgainstKubeAPIServer: a kubelet asks a real kube-apiserver,
// through the proxy and with the node's identity (Node authorizer,
// NodeRestriction), for the token of its pod's kube-api-access volume,
// in protobuf. With the cloud away the same request is answered with the
// same bytes; a request for another pod UID, for an audience never
// issued, or by another component is refused with 503. The pod's
// deletion, seen by the kubelet's pod watch, forgets its token.
func TestTokenAgainstKubeAPIServer(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const node = "edge-token"
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	offline := &switchable{}
	e := startEdge(t, edgeSpec{net: hostNet{}, server: cp.URL, node: node, cert: kp.TLS, ca: cp.CA, offline: offline})
	e.waitHealthy(true, 30*time.Second)
	kubelet, _ := e.client(kubeletUA)
	if _, err := kubelet.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createWorkload(ctx, t, cp.Client, node) // the namespace and its default service account
	// A pod with the volume the ServiceAccount admission injects
	// (kube-api-access-*: audience "", 3607 s), which NodeRestriction
	// checks the token's audience against.
	pod, err := cp.Client.CoreV1().Pods(workNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-token"},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}},
			Volumes: []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}}},
			}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet's pod watch, whose DELETED events forget tokens.
	podInformer, stopInformer := startPodInformer(t, kubelet, "spec.nodeName="+node, "")
	defer stopInformer()
	waitKeys(t, "kubelet's informer", podInformer, workNS+"/pod-token")

	tr := tokenRequest(pod.Name, pod.UID)
	online, onlineBody := askToken(t, e.Addr, kubeletUA, workNS, "default", tr, true)
	if online.StatusCode != http.StatusCreated {
		t.Fatalf("token through the proxy online: %s %s", online.Status, onlineBody)
	}
	kept, _, err := e.Store.Token("kubelet", mustKey(t, workNS, "default", tr))
	if err != nil || kept == nil {
		t.Fatalf("the token was not kept: %v", err)
	}
	// The kube-api-access token's JWT is valid for a year while its
	// status says an hour: the proxy reads the JWT.
	if status := time.Now().Add(time.Hour); !kept.Expires.After(status.Add(24 * time.Hour)) {
		t.Errorf("kept until %v: not the JWT's exp (the status says an hour)", kept.Expires)
	}
	// A token for a pod UID that is not the pod's: the cloud refuses it.
	if resp, b := askToken(t, e.Addr, kubeletUA, workNS, "default", tokenRequest(pod.Name, "not-the-uid"), true); resp.StatusCode == http.StatusCreated {
		t.Fatalf("the cloud issued a token for another uid: %s", b)
	}

	offline.set(true)
	resp, body := askToken(t, e.Addr, kubeletUA, workNS, "default", tr, true)
	if resp.StatusCode != http.StatusCreated || !bytes.Equal(body, onlineBody) {
		t.Errorf("offline: %s, want 201 with the bytes the cloud answered", resp.Status)
	}
	// client-go, as kubelet's token manager calls it.
	got, err := kubelet.CoreV1().ServiceAccounts(workNS).CreateToken(ctx, "default", tr, metav1.CreateOptions{})
	if err != nil || got.Status.Token != tokenOfAnswer(t, online, onlineBody) || got.Spec.BoundObjectRef.UID != pod.UID {
		t.Errorf("offline CreateToken: %v", err)
	}
	_, err = kubelet.CoreV1().ServiceAccounts(workNS).CreateToken(ctx, "default", tokenRequest(pod.Name, "not-the-uid"), metav1.CreateOptions{})
	if !apierrors.IsServiceUnavailable(err) {
		t.Errorf("offline, another uid: %v, want 503", err)
	}
	_, err = kubelet.CoreV1().ServiceAccounts(workNS).CreateToken(ctx, "default", tokenRequest(pod.Name, pod.UID, "vault"), metav1.CreateOptions{})
	if !apierrors.IsServiceUnavailable(err) {
		t.Errorf("offline, an audience never issued: %v, want 503", err)
	}
	kubeProxy, _ := e.client("kube-proxy/v1.36.3")
	_, err = kubeProxy.CoreV1().ServiceAccounts(workNS).CreateToken(ctx, "default", tr, metav1.CreateOptions{})
	if !apierrors.IsServiceUnavailable(err) {
		t.Errorf("offline, kube-proxy: %v, want 503", err)
	}

	// Back online: the cloud answers again, a new token.
	offline.set(false)
	testenv.EventuallyNoError(t, "a token from the cloud again", func() error {
		_, err := kubelet.CoreV1().ServiceAccounts(workNS).CreateToken(ctx, "default", tr, metav1.CreateOptions{})
		return err
	})
	if n := e.metric("tether_edge_apiserver_tokens_stored_total", "component", "kubelet"); n < 2 {
		t.Errorf("tokens stored: %v, want the online ones", n)
	}
	// The pod is deleted: its token goes with it.
	if err := cp.Client.CoreV1().Pods(workNS).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the deleted pod's token forgotten", func() bool { return e.Store.TokenCount()["kubelet"] == 0 })
}

// mustKey is the key the proxy keeps tr's answer under.
func mustKey(t *testing.T, ns, sa string, tr *authenticationv1.TokenRequest) edgecache.TokenKey {
	t.Helper()
	var body bytes.Buffer
	if err := protobuf.Serializer.Encode(tr, &body); err != nil {
		t.Fatal(err)
	}
	r := request{}
	r.Namespace, r.Name = ns, sa
	k, err := tokenKeyOf("application/vnd.kubernetes.protobuf", body.Bytes(), r)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
