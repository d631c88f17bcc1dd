package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/testenv"
)

// registeredAnnotation is nodewatch.RegisteredAnnotation, spelled out: the
// test names the contract, not the code.
const registeredAnnotation = "tether.io/registered-addresses"

// TestAddressClaims: a thief holding one edge node's key (edge-0) writes
// addresses of its LAN into its own Node, with every shipped manifest
// applied, and adds them to its host so that its real tether-edge accepts
// them. The holder of an address (edge-x1) and an edge installed after the
// thief's claim (edge-x2) register their Nodes themselves, with their
// addresses, as kubelets do. Honest clients verify nothing (curl -k).
func TestAddressClaims(t *testing.T) {
	testenv.RequireRoot(t)
	w := world.New(t, bins, world.Options{Sites: []testenv.SiteSpec{
		{Name: "site-x", Hosts: []string{"edge-0", "edge-x1", "edge-x2"}, LAN: netip.MustParsePrefix("192.168.9.0/24")},
	}}, t.Logf)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w.ApplyShipped(t, "edge-rbac.yaml", "node-admission.yaml")
	thief, holder, newcomer := w.Edge("edge-0"), w.Edge("edge-x1"), w.Edge("edge-x2")
	thiefIP, holderIP, newIP := thief.Host.Addr.String(), holder.Host.Addr.String(), newcomer.Host.Addr.String()

	// The world registered every Node as the operator; the holder and
	// the newcomer register their own instead, as a kubelet does.
	for _, e := range []*world.Edge{holder, newcomer} {
		if err := w.CP.Client.CoreV1().Nodes().Delete(ctx, e.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A node registers itself with its own labels; the operator puts it
	// in its pool (the node policy refuses the pool label on create).
	register := func(t *testing.T, e *world.Edge, dryRun []string) (*corev1.Node, error) {
		t.Helper()
		c, _, _ := w.CP.NodeClient(t, e.Name)
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: e.Name, Labels: map[string]string{world.EdgeLabel: "true", corev1.LabelHostname: e.Name},
				// What a node sends here is replaced by its addresses.
				Annotations: map[string]string{registeredAnnotation: "192.168.9.250"}},
			Status: corev1.NodeStatus{
				Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: e.Host.Addr.String()}, {Type: corev1.NodeHostName, Address: e.Name}},
				DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: world.KubeletPort}},
			},
		}
		created, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{DryRun: dryRun})
		if err != nil || dryRun != nil {
			return created, err
		}
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, world.PoolLabel, e.Site.Name)
		return w.CP.Client.CoreV1().Nodes().Patch(ctx, e.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	}
	// The registration stamp applies once kube-apiserver's policy
	// informer has the policy: wait for it with dry runs.
	testenv.EventuallyNoError(t, "a node's registration stamped with its addresses", func() error {
		n, err := register(t, holder, []string{metav1.DryRunAll})
		if err != nil {
			return err
		}
		if got := n.Annotations[registeredAnnotation]; got != holderIP {
			return fmt.Errorf("annotation %q, want %q", got, holderIP)
		}
		return nil
	})
	if _, err := register(t, holder, nil); err != nil {
		t.Fatalf("register %s: %v", holder.Name, err)
	}

	gw := w.Gateways[0]
	w.StartGateway(t, gw, "--dns-listen", ":53", "--dns-zone", world.Zone)
	w.StartEdge(t, thief)
	w.StartEdge(t, holder)
	w.RouteSitesVia(t, gw)

	stolen, _, _ := w.CP.NodeClient(t, thief.Name)
	claim := func(t *testing.T, addrs ...string) {
		t.Helper()
		var as []corev1.NodeAddress
		for _, a := range addrs {
			as = append(as, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
		}
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{"addresses": as}})
		// A merge patch replaces the list: the node claims exactly these.
		if _, err := stolen.CoreV1().Nodes().Patch(ctx, thief.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("the node may write its own addresses (NodeRestriction allows it): %v", err)
		}
	}
	// The thief's host takes the addresses it claims (on loopback, so that
	// the LAN still reaches their owners): its tether-edge dials only its
	// own addresses.
	thief.Host.Run(t, "ip", "addr", "add", holderIP+"/32", "dev", "lo")
	thief.Host.Run(t, "ip", "addr", "add", newIP+"/32", "dev", "lo")
	answeredBy := func(addr string) string {
		out, _ := w.Client.Command(ctx, "curl", "--silent", "--insecure", "--max-time", "5",
			fmt.Sprintf("https://%s:%d/healthz", addr, world.KubeletPort)).CombinedOutput()
		return strings.TrimPrefix(strings.TrimSpace(string(out)), "ok ")
	}
	untilAnsweredBy := func(t *testing.T, addr, node string) {
		t.Helper()
		testenv.EventuallyWithin(t, 60*time.Second, fmt.Sprintf("%s:%d answered by %s", addr, world.KubeletPort, node), func() bool {
			return answeredBy(addr) == node
		})
	}
	alwaysAnsweredBy := func(t *testing.T, addr, node string) {
		t.Helper()
		for i := range 10 {
			if got := answeredBy(addr); got != node {
				t.Fatalf("connection %d of 10 to %s answered by %q, want %s", i+1, addr, got, node)
			}
		}
	}
	hasRefusal := func(want statusapi.AddressRefusal) bool {
		for _, r := range gatewayStatus(t, gw).AddressRefusals {
			if r == want {
				return true
			}
		}
		return false
	}
	untilAnsweredBy(t, thiefIP, thief.Name)
	untilAnsweredBy(t, holderIP, holder.Name)

	t.Run("NoStampOfItsOwn", func(t *testing.T) {
		untilRefusedByPolicy(t, ctx, "the thief's dry run of its registered addresses", func(dryRun []string) error {
			patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, registeredAnnotation, thiefIP+","+newIP)
			_, err := stolen.CoreV1().Nodes().Patch(ctx, thief.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{DryRun: dryRun})
			return err
		})
	})

	// (b) A claim made after the holder's does not rob it.
	t.Run("ClaimAfterTheHolder", func(t *testing.T) {
		claim(t, thiefIP, holderIP)
		testenv.EventuallyWithin(t, 15*time.Second, "the gateway to refuse the thief's claim of the holder's address", func() bool {
			return hasRefusal(statusapi.AddressRefusal{Addr: holder.Host.Addr, Node: thief.Name, Reason: "conflict", Holder: holder.Name})
		})
		alwaysAnsweredBy(t, holderIP, holder.Name)
	})

	// (a) A claim made before the owner arrives does not hijack it.
	t.Run("SquatBeforeTheOwner", func(t *testing.T) {
		claim(t, thiefIP, holderIP, newIP)
		// Nobody else claims it yet: the squat works, for now.
		untilAnsweredBy(t, newIP, thief.Name)
		// The new edge is installed: it registers with its address and
		// dials the gateway.
		if _, err := register(t, newcomer, nil); err != nil {
			t.Fatalf("register %s: %v", newcomer.Name, err)
		}
		w.StartEdge(t, newcomer)
		untilAnsweredBy(t, newIP, newcomer.Name)
		alwaysAnsweredBy(t, newIP, newcomer.Name)
		alwaysAnsweredBy(t, holderIP, holder.Name)
		if !hasRefusal(statusapi.AddressRefusal{Addr: newcomer.Host.Addr, Node: thief.Name, Reason: "conflict", Holder: newcomer.Name}) {
			t.Errorf("the thief's claim of %s is not listed as refused: %+v", newIP, gatewayStatus(t, gw).AddressRefusals)
		}
	})

	// (c) Dozens of addresses: the bound is routed, and DNS answers within
	// its amplification bound.
	t.Run("DozensOfAddresses", func(t *testing.T) {
		many := []string{thiefIP}
		for i := range 40 {
			many = append(many, fmt.Sprintf("192.168.9.%d", 100+i))
		}
		claim(t, many...)
		// dig over UDP only (+ignore: no retry over TCP after TC), with the
		// query shown (+qr) to measure it.
		var out string
		testenv.EventuallyWithin(t, 15*time.Second, "DNS to answer the thief's new claims", func() bool {
			out = dig(t, w.Client, gw, "+qr", "+ignore", thief.Name+"."+world.Zone, "A")
			return strings.Contains(out, "\tA\t192.168.9.100\n") && !strings.Contains(out, "\tA\t"+newIP+"\n")
		})
		query, answer, records := digSizes(t, out)
		t.Logf("DNS for %s over UDP: query %d bytes, answer %d bytes (%.1fx), %d records", thief.Name, query, answer, float64(answer)/float64(query), records)
		if records > 4 {
			t.Errorf("DNS answers %d addresses of %s, want at most 4", records, thief.Name)
		}
		if answer > 4*query {
			t.Errorf("a %d-byte answer to a %d-byte query: more than 4 times", answer, query)
		}
		n := 0
		for _, r := range gatewayStatus(t, gw).AddressRefusals {
			if r.Node == thief.Name && r.Reason == "too_many" {
				n++
			}
		}
		if n != len(many)-4 {
			t.Errorf("%d of the thief's %d claims refused as too many, want %d", n, len(many), len(many)-4)
		}
		if v := gatewayMetric(t, gw, `tether_gateway_address_refusals{reason="too_many"}`); v != float64(len(many)-4) {
			t.Errorf("tether_gateway_address_refusals{reason=\"too_many\"} %v, want %d", v, len(many)-4)
		}
		// Its own address is routed (the first it lists).
		alwaysAnsweredBy(t, thiefIP, thief.Name)
	})
}

var (
	digQuerySize  = regexp.MustCompile(`(?m)^;; QUERY SIZE: (\d+)`)
	digAnswerSize = regexp.MustCompile(`(?m)^;; MSG SIZE\s+rcvd: (\d+)`)
	digAnswers    = regexp.MustCompile(`(?m)^;; flags:[^;]*; QUERY: \d+, ANSWER: (\d+)`)
)

// digSizes reads, from the output of dig +qr, the query's size, the
// answer's size and its number of answer records.
func digSizes(t *testing.T, out string) (query, answer, records int) {
	t.Helper()
	get := func(re *regexp.Regexp, all bool) int {
		m := re.FindAllStringSubmatch(out, -1)
		if len(m) == 0 {
			t.Fatalf("no %s in dig's output:\n%s", re, out)
		}
		i := 0
		if all {
			i = len(m) - 1 // the answer's header follows the query's
		}
		n, _ := strconv.Atoi(m[i][1])
		return n
	}
	return get(digQuerySize, false), get(digAnswerSize, false), get(digAnswers, true)
}
