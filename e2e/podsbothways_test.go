package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// Ports of the test pods: both serve /metrics, only declaredPort is in
// the pods' spec.containers[*].ports.
const (
	declaredPort   = 9100
	undeclaredPort = 9200
)

// tunnelPortsAnnotation names the ports of a pod the edge lets the cloud
// reach, in place of its declared ones.
const tunnelPortsAnnotation = "tether.io/tunnel-ports"

// TestPodsBothWays: cloud → edge pods (docs/proposals/pods-both-ways.md
// §1). Each edge Node has its own pod range in spec.podCIDRs, written by
// the admin (sites reuse LANs; pod ranges never repeat), and edge-1 runs
// a full kubelet on containerd behind its site's NAT. The gateway routes
// --edge-pod-cidrs; a client on the gateway host (option (a): its
// connections to a pod address are redirected on that host) reaches a
// pod's declared port through edge-1's tunnel, and the edge refuses any
// other port (not_allowed), unless the pod's tether.io/tunnel-ports
// annotation names it, which replaces the declared ones.
func TestPodsBothWays(t *testing.T) {
	testenv.RequireRoot(t)
	// edge-2, a stand-in on another site, only owns another range.
	// The webhook subtest: kube-apiserver calls a webhook Service at its
	// endpoint's address, as it does with this flag, rather than at the
	// ClusterIP, which needs a kube-proxy on its host.
	w := world.New(t, bins, world.Options{RealKubelets: []string{"edge-1"}, PodCIDRs: true,
		APIServerArgs: []string{"--enable-aggregator-routing=true"}}, t.Logf)
	w.ApplyEdgeRBAC(t)
	gw := w.Gateways[0]
	gwCmd := w.StartGateway(t, gw, "--netrules", "nftables", "--edge-pod-cidrs="+world.EdgePodCIDRs.String())
	// requireGateway ends the test at once if the gateway exited (a flag
	// it does not know, a bad range): nothing can reach a pod then.
	requireGateway := func(t *testing.T, what string) {
		t.Helper()
		if gw.Exited(gwCmd) {
			log := strings.TrimSpace(gw.Log(gwCmd))
			t.Fatalf("%s: tether-gateway on %s exited: %s", what, gw.Label, log[strings.LastIndexByte(log, '\n')+1:])
		}
	}
	edge, other := w.Edge("edge-1"), w.Edge("edge-2")
	if edge.PodCIDR == other.PodCIDR || !edge.PodCIDR.IsValid() {
		t.Fatalf("pod ranges of edge-1 %s and edge-2 %s: want two distinct ranges", edge.PodCIDR, other.PodCIDR)
	}
	w.StartEdge(t, edge, w.ProxyArgs(edge)...)
	w.StartEdge(t, other)
	w.StartRealKubelet(t, edge, world.RealKubeletOptions{})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// The kubelet registered through tether-edge with the Node the admin
	// made: the range is still the one the admin wrote.
	n, err := w.CP.Client.CoreV1().Nodes().Get(ctx, edge.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{edge.PodCIDR.String()}; fmt.Sprint(n.Spec.PodCIDRs) != fmt.Sprint(want) {
		t.Fatalf("node %s spec.podCIDRs = %v, want %v", edge.Name, n.Spec.PodCIDRs, want)
	}

	declared := startMetricsPod(t, ctx, w, edge, "declared", map[string]string{"app": "metrics"}, nil)
	annotated := startMetricsPod(t, ctx, w, edge, "annotated", map[string]string{"app": "annotated"},
		map[string]string{tunnelPortsAnnotation: fmt.Sprint(undeclaredPort)})

	// Both ports of both pods answer on the edge host itself, so that
	// what the cloud cannot reach below is refused, not absent.
	for _, ip := range []netip.Addr{declared, annotated} {
		for _, port := range []int{declaredPort, undeclaredPort} {
			url := metricsURL(ip, port)
			testenv.EventuallyNoError(t, "GET "+url+" on "+edge.Name+" itself", func() error {
				body, err := world.Get(ctx, edge.Host, url)
				if err == nil && body != metricsBody(port) {
					err = fmt.Errorf("body %q, want %q", body, metricsBody(port))
				}
				return err
			})
		}
	}

	// refusals reads edge-1's count of streams it refused by its allow list.
	refusals := func(t *testing.T) float64 {
		t.Helper()
		m, err := world.Get(ctx, edge.Host, world.EdgeAdmin("/metrics"))
		if err != nil {
			t.Fatalf("metrics of %s: %v", edge.Name, err)
		}
		return world.Metric(m, `tether_edge_tunnel_streams_total{result="not_allowed"}`)
	}

	t.Run("CloudToPod", func(t *testing.T) {
		// Allowed: the pod's body, from the gateway host.
		for _, c := range []struct {
			pod  netip.Addr
			port int
		}{{declared, declaredPort}, {annotated, undeclaredPort}} {
			url := metricsURL(c.pod, c.port)
			testenv.EventuallyNoError(t, fmt.Sprintf("GET %s from the gateway host, through %s's tunnel (pod range %s routed by --edge-pod-cidrs %s)",
				url, edge.Name, edge.PodCIDR, world.EdgePodCIDRs), func() error {
				requireGateway(t, "GET "+url+" from the gateway host")
				body, err := world.Get(ctx, gw, url)
				if err != nil {
					return err
				}
				if want := metricsBody(c.port); body != want {
					return fmt.Errorf("body %q, want %q", body, want)
				}
				return nil
			})
		}
		// Refused by the edge: a port the pod does not declare, and a
		// declared port of a pod whose annotation replaces them.
		for _, c := range []struct {
			pod  netip.Addr
			port int
		}{{declared, undeclaredPort}, {annotated, declaredPort}} {
			url := metricsURL(c.pod, c.port)
			before := refusals(t)
			if body, err := world.Get(ctx, gw, url); err == nil {
				t.Errorf("GET %s from the gateway host answered %q: the port is not allowed for that pod", url, body)
			}
			testenv.Eventually(t, fmt.Sprintf("%s to count the stream to %s as not_allowed (had %v)", edge.Name, url, before), func() bool {
				return refusals(t) > before
			})
		}
	})

	t.Run("Prometheus", func(t *testing.T) {
		cfg := prometheusConfig(t, ctx, w, edge)
		before := refusals(t)
		prom := testenv.StartPrometheus(t, gw, cfg)

		// Discovery: Prometheus lists the pod from the apiserver and
		// makes one target per declared port, and the second job one on
		// the undeclared port.
		want := map[string]string{
			"edge-pods":            metricsURL(declared, declaredPort),
			"edge-pods-undeclared": metricsURL(declared, undeclaredPort),
		}
		testenv.EventuallyNoError(t, "Prometheus on the gateway host to discover the pod's targets", func() error {
			targets, err := prom.Targets(ctx)
			if err != nil {
				return err
			}
			got := map[string]string{}
			for _, tg := range targets {
				got[tg.ScrapePool] = tg.ScrapeURL
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("targets by scrape pool %v, want %v", got, want)
			}
			return nil
		})
		t.Logf("Prometheus discovered %v", want)

		testenv.EventuallyNoError(t, fmt.Sprintf("Prometheus on the gateway host to scrape %s (up == 1)", want["edge-pods"]), func() error {
			requireGateway(t, "Prometheus's scrape of "+want["edge-pods"])
			v, err := promUp(ctx, prom, "edge-pods")
			if err != nil {
				return err
			}
			if v != 1 {
				return fmt.Errorf("up = %v; %s", v, lastErrors(ctx, prom))
			}
			samples, err := prom.Query(ctx, fmt.Sprintf(`tether_test_up{job="edge-pods",port="%d"}`, declaredPort))
			if err != nil {
				return err
			}
			if len(samples) != 1 || samples[0].Value != 1 {
				return fmt.Errorf("tether_test_up scraped from the pod: %v", samples)
			}
			return nil
		})
		testenv.EventuallyNoError(t, fmt.Sprintf("Prometheus to scrape %s, refused (up == 0)", want["edge-pods-undeclared"]), func() error {
			v, err := promUp(ctx, prom, "edge-pods-undeclared")
			if err != nil {
				return err
			}
			if v != 0 {
				return fmt.Errorf("up = %v through a port the pod does not declare", v)
			}
			return nil
		})
		testenv.Eventually(t, fmt.Sprintf("%s to count Prometheus's scrapes of %s as not_allowed (had %v)", edge.Name, want["edge-pods-undeclared"], before), func() bool {
			return refusals(t) > before
		})
	})

	// FromCloudHost: a cloud host that is not the gateway's, with the
	// edge pod ranges routed to the gateway host, reaches the pod.
	t.Run("FromCloudHost", func(t *testing.T) {
		routePodsVia(t, w.Client, gw)
		url := metricsURL(declared, declaredPort)
		testenv.EventuallyNoError(t, "GET "+url+" from the client host, routed via the gateway host", func() error {
			body, err := world.Get(ctx, w.Client, url)
			if err == nil && body != metricsBody(declaredPort) {
				err = fmt.Errorf("body %q", body)
			}
			return err
		})
	})

	t.Run("Webhook", func(t *testing.T) {
		testWebhookOnEdgePod(t, ctx, w, edge, gw)
	})

	// StatusIPLie: edge-1's key writes, as its pod's status IP, an address
	// in edge-2's range. Routing never reads pod status: a connection to
	// that address goes to edge-2, the range's owner, which has no such
	// pod and refuses it; edge-1 is never asked.
	t.Run("StatusIPLie", func(t *testing.T) {
		b := other.PodCIDR.Addr().As4()
		lie := netip.AddrFrom4([4]byte{b[0], b[1], b[2], 77}) // in edge-2's range
		kp, err := w.ClusterCA.NodeCert(edge.Name)
		if err != nil {
			t.Fatal(err)
		}
		thief, err := kubernetes.NewForConfig(w.CP.RESTConfig(kp))
		if err != nil {
			t.Fatal(err)
		}
		pods := thief.CoreV1().Pods("default")
		p, err := pods.Get(ctx, "declared", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.PodIP, p.Status.PodIPs = lie.String(), []corev1.PodIP{{IP: lie.String()}}
		if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("edge-1's key writes its pod's status IP %s: %v", lie, err)
		}
		streams := func(e *world.Edge) float64 {
			m, err := world.Get(ctx, e.Host, world.EdgeAdmin("/metrics"))
			if err != nil {
				t.Fatalf("metrics of %s: %v", e.Name, err)
			}
			return world.Metric(m, `tether_edge_tunnel_streams_total{result="ok"}`) + world.Metric(m, `tether_edge_tunnel_streams_total{result="not_allowed"}`)
		}
		mineBefore, ownerBefore := streams(edge), streams(other)
		url := metricsURL(lie, declaredPort)
		if body, err := world.Get(ctx, gw, url); err == nil {
			t.Fatalf("GET %s answered %q: a pod status IP outside its node's range reached something", url, body)
		}
		testenv.Eventually(t, fmt.Sprintf("%s, which owns %s, to be asked for %s and refuse it", other.Name, other.PodCIDR, lie), func() bool {
			return streams(other) > ownerBefore
		})
		if got := streams(edge); got != mineBefore {
			t.Errorf("%s, whose key wrote the lie, was asked for %v streams: routing read a pod's status", edge.Name, got-mineBefore)
		}
	})
}

// testWebhookOnEdgePod runs a validating admission webhook in a pod on e
// (its Service's only endpoint is the pod's address, behind the site's
// NAT) and shows kube-apiserver calling it through the gateway: its
// verdict denies a ConfigMap named deny-*, and allows another.
func testWebhookOnEdgePod(t *testing.T, ctx context.Context, w *world.World, e *world.Edge, gw *testenv.Host) {
	const (
		name = "tether-webhook"
		port = 8443
	)
	routePodsVia(t, w.Topo.Cloud("apiserver"), gw)
	dir := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "webhookpod"), "./webhookpod")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the webhook: %v\n%s", err, out)
	}
	ca := testenv.MustCA(t, "tether-test-webhook-ca")
	kp, err := ca.ServerCert(name, name+".default.svc")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := kp.WriteFiles(dir, "tls"); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)

	c := w.CP.Client
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:                      e.Name,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Volumes:                       []corev1.Volume{{Name: "hook", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}}},
			Containers: []corev1.Container{{
				Name: "hook", Image: testenv.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"/hook/webhookpod", "--listen", fmt.Sprintf(":%d", port), "--cert", "/hook/tls.crt", "--key", "/hook/tls.key"},
				VolumeMounts: []corev1.VolumeMount{{Name: "hook", MountPath: "/hook", ReadOnly: true}},
				Ports:        []corev1.ContainerPort{{Name: "https", ContainerPort: port, Protocol: corev1.ProtocolTCP}},
			}},
		},
	}
	if _, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the webhook pod: %v", err)
	}
	var ip string
	testenv.EventuallyWithin(t, 2*time.Minute, "the webhook pod Running with an address", func() bool {
		p, err := c.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			ip = p.Status.PodIP
		}
		return ip != ""
	})
	// A Service whose one endpoint is the pod, as the EndpointSlice
	// controller would write it.
	if _, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(port)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the webhook Service: %v", err)
	}
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "tether-test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](port), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{ip}, NodeName: ptr.To(e.Name),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the webhook's EndpointSlice: %v", err)
	}
	hooks := c.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := hooks.Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "deny.tether.example",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service:  &admissionregistrationv1.ServiceReference{Namespace: "default", Name: name, Path: ptr.To("/validate"), Port: ptr.To[int32](443)},
				CABundle: ca.CertPEM,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			// Only the test's ConfigMaps; a webhook that fails closed.
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"tether-test": "webhook"}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the webhook configuration: %v", err)
	}
	t.Cleanup(func() { hooks.Delete(context.Background(), name, metav1.DeleteOptions{}) })

	cm := func(n string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: "default", Labels: map[string]string{"tether-test": "webhook"}}}
	}
	cms := c.CoreV1().ConfigMaps("default")
	// The first calls may find the webhook not listening yet (fail
	// closed: refused with a call error), never allowed.
	testenv.EventuallyNoError(t, "kube-apiserver to call the webhook on "+e.Name+" at "+ip+" and deny deny-me", func() error {
		_, err := cms.Create(ctx, cm("deny-me"), metav1.CreateOptions{})
		switch {
		case err == nil:
			t.Fatal("deny-me was created: the webhook's verdict did not take effect")
		case !strings.Contains(err.Error(), "edge webhook denies ConfigMap default/deny-me"):
			return err
		}
		return nil
	})
	if _, err := cms.Create(ctx, cm("allow-me"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("allow-me refused: %v", err)
	}
}

// The tests below reach edge pods from cloud hosts other than the
// gateway's, whose routes send the edge pod ranges to the gateway host as
// a VPC route table (or a route on every cloud node) does.
func routePodsVia(t *testing.T, h, gw *testenv.Host) {
	t.Helper()
	h.Run(t, "ip", "route", "replace", world.EdgePodCIDRs.String(), "via", gw.Addr.String())
}

// startMetricsPod runs a busybox pod on e serving metricsBody(port) at
// /metrics on declaredPort and undeclaredPort, declaring only the first,
// and returns its address once it runs, which must lie in e's pod range.
func startMetricsPod(t *testing.T, ctx context.Context, w *world.World, e *world.Edge, name string, labels, annotations map[string]string) netip.Addr {
	t.Helper()
	c := w.CP.Client.CoreV1()
	_, err := c.ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create service account: %v", err)
	}
	var script strings.Builder
	for _, port := range []int{declaredPort, undeclaredPort} {
		fmt.Fprintf(&script, "mkdir -p /www/%d && printf '%%s' '%s' > /www/%d/metrics && ", port, metricsBody(port), port)
	}
	fmt.Fprintf(&script, "httpd -p %d -h /www/%d && exec httpd -f -p %d -h /www/%d", undeclaredPort, undeclaredPort, declaredPort, declaredPort)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{
			NodeName:                      e.Name,
			AutomountServiceAccountToken:  ptr.To(false),
			DNSPolicy:                     corev1.DNSDefault,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "main", Image: testenv.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", script.String()},
				Ports:   []corev1.ContainerPort{{Name: "metrics", ContainerPort: declaredPort, Protocol: corev1.ProtocolTCP}},
			}},
		},
	}
	if _, err := c.Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	testenv.EventuallyWithin(t, 2*time.Minute, "pod "+name+" Running with an address", func() bool {
		p, err := c.Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
	})
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil || !e.PodCIDR.Contains(ip) {
		t.Fatalf("pod %s has address %q (%v), want one in %s's range %s", name, pod.Status.PodIP, err, e.Name, e.PodCIDR)
	}
	t.Logf("pod %s running on %s at %s (declares %d, serves %d too; annotations %v)", name, e.Name, ip, declaredPort, undeclaredPort, annotations)
	return ip
}

// metricsBody is what a test pod serves on port, in Prometheus's text
// format.
func metricsBody(port int) string {
	return fmt.Sprintf("# TYPE tether_test_up gauge\ntether_test_up{port=\"%d\"} 1\n", port)
}

func metricsURL(ip netip.Addr, port int) string {
	return "http://" + net.JoinHostPort(ip.String(), fmt.Sprint(port)) + "/metrics"
}

// prometheusUser is the identity Prometheus lists pods as.
const prometheusUser = "tether-test-prometheus"

// prometheusConfig grants prometheusUser the reading of pods, writes its
// client certificate and returns a Prometheus configuration with two
// jobs over the pods labelled app=metrics on e, found with the pod role
// of kubernetes_sd_configs: edge-pods scrapes each declared port at the
// pod's address, as a cluster's Prometheus does; edge-pods-undeclared
// scrapes the same pods on undeclaredPort.
func prometheusConfig(t *testing.T, ctx context.Context, w *world.World, e *world.Edge) string {
	t.Helper()
	rbac := w.CP.Client.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: prometheusUser},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create cluster role: %v", err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: prometheusUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: prometheusUser},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: prometheusUser}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create cluster role binding: %v", err)
	}
	kp, err := w.ClusterCA.ClientCert(prometheusUser)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := kp.WriteFiles(w.Dir, prometheusUser)
	if err != nil {
		t.Fatal(err)
	}
	sd := fmt.Sprintf(`
      - role: pod
        api_server: %q
        tls_config: {ca_file: %q, cert_file: %q, key_file: %q}
        namespaces: {names: [default]}
        selectors: [{role: pod, field: "spec.nodeName=%s", label: "app=metrics"}]`,
		w.CP.URL, w.Path("cluster-ca.crt"), cert, key, e.Name)
	return fmt.Sprintf(`global:
  scrape_interval: 3s
  scrape_timeout: 3s
scrape_configs:
  - job_name: edge-pods
    # busybox's httpd sends no text/plain for a file without extension.
    fallback_scrape_protocol: PrometheusText0.0.4
    kubernetes_sd_configs:%[1]s
    relabel_configs:
      - {source_labels: [__meta_kubernetes_pod_container_port_number], regex: ".+", action: keep}
      - {source_labels: [__meta_kubernetes_pod_ip, __meta_kubernetes_pod_container_port_number], regex: "(.+);(.+)", target_label: __address__, replacement: "$1:$2"}
      - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
  - job_name: edge-pods-undeclared
    fallback_scrape_protocol: PrometheusText0.0.4
    kubernetes_sd_configs:%[1]s
    relabel_configs:
      - {source_labels: [__meta_kubernetes_pod_container_port_number], regex: "%[2]d", action: keep}
      - {source_labels: [__meta_kubernetes_pod_ip], regex: "(.+)", target_label: __address__, replacement: "$1:%[3]d"}
      - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
`, sd, declaredPort, undeclaredPort)
}

// promUp is the value of up for job's one target.
func promUp(ctx context.Context, prom *testenv.Prometheus, job string) (float64, error) {
	samples, err := prom.Query(ctx, fmt.Sprintf(`up{job=%q}`, job))
	if err != nil {
		return 0, err
	}
	if len(samples) != 1 {
		return 0, fmt.Errorf("up{job=%q}: %d series (not scraped yet?)", job, len(samples))
	}
	return samples[0].Value, nil
}

// lastErrors lists the targets' last scrape errors, for a failure message.
func lastErrors(ctx context.Context, prom *testenv.Prometheus) string {
	targets, err := prom.Targets(ctx)
	if err != nil {
		return err.Error()
	}
	var s []string
	for _, tg := range targets {
		s = append(s, fmt.Sprintf("%s %s: %s", tg.ScrapeURL, tg.Health, tg.LastError))
	}
	return "targets: " + strings.Join(s, "; ")
}
