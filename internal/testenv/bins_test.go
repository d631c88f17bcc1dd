package testenv

import (
	"strings"
	"testing"
)

func TestParseBins(t *testing.T) {
	out := "KUBE_APISERVER=/c/kube/kube-apiserver\nKUBE_PROXY=/c/kube/kube-proxy\n" +
		"KUBE_CONTROLLER_MANAGER=/c/kube/kube-controller-manager\nKUBEMARK=/c/kube/kubemark\nKUBELET=/c/kube/kubelet\n" +
		"KUBECTL=/c/kube/kubectl\n" +
		"ETCD=/c/etcd/etcd\nPEBBLE=/c/pebble/pebble\n" +
		"HELM=/c/helm/helm\nPROMETHEUS=/c/prometheus/prometheus\n"
	b, err := parseBins([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := Bins{
		KubeAPIServer:         "/c/kube/kube-apiserver",
		KubeProxy:             "/c/kube/kube-proxy",
		KubeControllerManager: "/c/kube/kube-controller-manager",
		Etcd:                  "/c/etcd/etcd",
		Kubemark:              "/c/kube/kubemark",
		Kubelet:               "/c/kube/kubelet",
		Kubectl:               "/c/kube/kubectl",
		Pebble:                "/c/pebble/pebble",
		Helm:                  "/c/helm/helm",
		Prometheus:            "/c/prometheus/prometheus",
	}
	if b != want {
		t.Errorf("parseBins = %+v, want %+v", b, want)
	}

	// An older script that does not build kube-controller-manager.
	_, err = parseBins([]byte("KUBE_APISERVER=/a\nKUBE_PROXY=/p\nETCD=/e\n"))
	if err == nil || !strings.Contains(err.Error(), "no KUBE_CONTROLLER_MANAGER= line") {
		t.Errorf("parseBins without kube-controller-manager: err = %v", err)
	}
}
