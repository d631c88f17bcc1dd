package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/retired"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestNodeRetire runs `tetherctl node retire`, `retired` and `unretire`
// against a real kube-apiserver with the shipped admission policies: the
// retired node's Node is deleted, its identity may no longer register a
// Node or request a certificate, and other nodes still register (into no
// pool: that is the operator's).
func TestNodeRetire(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const manifests = "../../packaging/kubernetes/"
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, manifests+"pool-rbac.yaml", manifests+"node-admission.yaml"); err != nil {
		t.Fatal(err)
	}
	admin := cp.Client
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1",
		Labels: map[string]string{openyurt.PoolLabel: "shop"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	edge1, _, _ := cp.NodeClient(t, "edge-1")
	edge2, _, _ := cp.NodeClient(t, "edge-2")

	code, out, errOut := runCtl("node", "retire", "edge-1", "--kubeconfig", cp.AdminKubeconfig)
	if code != exitOK || !strings.Contains(out, "node edge-1 retired at ") || !strings.Contains(out, "its Node was deleted") {
		t.Fatalf("retire: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := admin.CoreV1().Nodes().Get(ctx, "edge-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("edge-1's Node after retire: %v, want not found", err)
	}

	// The retired key registers its Node again, without labels: refused
	// once kube-apiserver's policy informers have the policy and its
	// parameter.
	bare := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1"}}
	untilRefused(t, "edge-1 registers again", "is retired", func(dryRun []string) error {
		_, err := edge1.CoreV1().Nodes().Create(ctx, bare, metav1.CreateOptions{DryRun: dryRun})
		return err
	})
	if _, err := edge1.CoreV1().Nodes().Create(ctx, bare, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the retired key's registration: %v, want forbidden", err)
	}
	// Nor may it renew itself into a certificate issued after the
	// retirement.
	if _, err := edge1.CertificatesV1().CertificateSigningRequests().Create(ctx, nodeCSR(t, "edge-1"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "is retired") {
		t.Errorf("the retired key's certificate request: %v, want refused as retired", err)
	}

	// Another node registers with the kubelet's labels and the edge
	// label, but not into a pool.
	untilRefused(t, "edge-2 registers into a pool", "may not register its Node with the label", func(dryRun []string) error {
		_, err := edge2.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-2",
			Labels: map[string]string{openyurt.PoolLabel: "shop"}}}, metav1.CreateOptions{DryRun: dryRun})
		return err
	})
	if _, err := edge2.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-2",
		Labels: map[string]string{corev1.LabelHostname: "edge-2", corev1.LabelOSStable: "linux", openyurt.EdgeLabel: "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("edge-2 registers with the kubelet's labels: %v", err)
	}
	if _, err := edge2.CertificatesV1().CertificateSigningRequests().Create(ctx, nodeCSR(t, "edge-2"), metav1.CreateOptions{}); err != nil {
		t.Errorf("edge-2 requests a certificate: %v", err)
	}

	// The listing.
	code, out, _ = runCtl("node", "retired", "--kubeconfig", cp.AdminKubeconfig)
	if rows := cells(out); code != exitOK || len(rows) != 2 || rows[0][0] != "NODE" || rows[1][0] != "edge-1" {
		t.Errorf("retired: exit %d\n%s", code, out)
	}
	code, out, _ = runCtl("node", "retired", "-o", "json", "--kubeconfig", cp.AdminKubeconfig)
	var ns []retiredNode
	if err := json.Unmarshal([]byte(out), &ns); code != exitOK || err != nil || len(ns) != 1 || ns[0].Node != "edge-1" || time.Since(ns[0].Retired) > time.Minute {
		t.Errorf("retired -o json: exit %d, %v\n%s", code, err, out)
	}

	// Retiring a node without a Node records it all the same.
	code, out, _ = runCtl("--kubeconfig", cp.AdminKubeconfig, "node", "retire", "edge-9")
	if code != exitOK || !strings.Contains(out, "it has no Node") {
		t.Errorf("retire edge-9: exit %d\n%s", code, out)
	}
	cm, err := admin.CoreV1().ConfigMaps(retired.Namespace).Get(ctx, retired.ConfigMap, metav1.GetOptions{})
	if err != nil || len(cm.Data) != 2 {
		t.Fatalf("the record: %v, %v", cm, err)
	}

	// Unretired, the name registers again.
	code, out, _ = runCtl("node", "unretire", "edge-1", "--kubeconfig", cp.AdminKubeconfig)
	if code != exitOK || !strings.Contains(out, "no longer retired") {
		t.Errorf("unretire: exit %d\n%s", code, out)
	}
	testenv.EventuallyNoError(t, "edge-1 registers once unretired", func() error {
		_, err := edge1.CoreV1().Nodes().Create(ctx, bare, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
	if code, out, _ = runCtl("node", "unretire", "edge-1", "--kubeconfig", cp.AdminKubeconfig); code != exitOK || !strings.Contains(out, "was not retired") {
		t.Errorf("unretire again: exit %d\n%s", code, out)
	}

	// Without the RBAC, the operator is told what is needed.
	nobody, err := cp.CA.ClientCert("nobody")
	if err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runCtl("node", "retire", "edge-2", "--kubeconfig", cp.Kubeconfig(t, "nobody", nobody))
	if code != exitError || !strings.Contains(errOut, nodeRBAC) {
		t.Errorf("retire without RBAC: exit %d, stderr %q", code, errOut)
	}
}

// untilRefused repeats do (first as a dry run) until kube-apiserver
// refuses it with a message containing want: admission policies and their
// parameters apply a moment after they are stored.
func untilRefused(t *testing.T, what, want string, do func(dryRun []string) error) {
	t.Helper()
	testenv.EventuallyNoError(t, what+": refused", func() error {
		err := do([]string{metav1.DryRunAll})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), want) {
			return nil
		}
		return fmt.Errorf("last answer: %v", err)
	})
}

// nodeCSR is a kubelet client certificate request for node.
func nodeCSR(t *testing.T, node string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{GenerateName: "csr-" + node + "-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		}}
}
