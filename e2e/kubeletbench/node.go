package main

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// node is an edge node of the bench: its hollow kubelet, its tether-edge
// (nil when the kubelet talks straight to kube-apiserver) and the pods
// bound to it.
type node struct {
	s    *testenv.Session
	w    *world.World
	bins world.Binaries
	e    *world.Edge
	k    *world.HollowKubelet
	edge *exec.Cmd // tether-edge, or nil
	ns   string
	uids map[string]types.UID
}

func (n *node) mode() string {
	if n.k != nil && n.k.Straight {
		return "straight"
	}
	return "through"
}

// edgeArgs are the flags of tether-edge beyond the world's (gateways,
// certificate): the product's defaults for the apiserver proxy, with a
// data directory that outlives a restart, the cache serving the hollow
// kubelet too, and info logging (the world's is debug).
func (n *node) edgeArgs() []string {
	return []string{
		"--server-addr", n.w.CP.URL,
		"--server-ca", n.w.Path("cluster-ca.crt"),
		"--data-dir", n.w.Path(n.e.Name + "-data"),
		"--cache-components", world.HollowComponents,
		"--log-level", "info",
	}
}

// startEdge starts tether-edge on the node.
func (n *node) startEdge() {
	n.edge = n.w.StartEdge(n.s, n.e, n.edgeArgs()...)
}

// edgePID is the pid of the tether-edge process (not of `ip netns exec`).
func (n *node) edgePID(ctx context.Context) (int, error) {
	if n.edge == nil {
		return 0, fmt.Errorf("no tether-edge on %s", n.e.Name)
	}
	return benchkit.RealPID(ctx, n.edge.Process.Pid, n.bins.Edge)
}

// startKubelet starts the hollow kubelet and returns when it started.
func (n *node) startKubelet(straight bool) time.Time {
	start := time.Now()
	n.k = n.w.StartHollowKubelet(n.s, n.e, straight)
	return start
}

// waitReady waits until the Node is Ready with a heartbeat of the
// kubelet started at since: pods bound before the kubelet posted the
// node's capacity would be refused (OutOfpods), as with any kubelet.
func (n *node) waitReady(ctx context.Context, since time.Time, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for {
		node, err := n.w.CP.Client.CoreV1().Nodes().Get(ctx, n.e.Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)) {
					return nil
				}
			}
		}
		if n.k.Exited() {
			return fmt.Errorf("the kubelet of %s exited:\n%s", n.e.Name, benchkit.Tail(n.k.Log(), 3000))
		}
		if err := benchkit.Sleep(ctx, 250*time.Millisecond); err != nil {
			return fmt.Errorf("node %s not Ready within %v of its kubelet's start", n.e.Name, bound)
		}
	}
}

// createPods creates the node's workload in namespace ns.
func (n *node) createPods(ctx context.Context, ns string, pods int, noToken bool) error {
	uids, err := world.CreateWorkload(ctx, n.w.CP.Client, n.w.CP.CA.CertPEM, world.WorkloadOptions{
		Namespace: ns, Node: n.e.Name, Pods: pods, NoToken: noToken})
	if err != nil {
		return err
	}
	n.ns, n.uids = ns, uids
	return nil
}

// deletePods removes the node's pods from the cloud at once (grace period
// 0: no kubelet confirms it).
func (n *node) deletePods(ctx context.Context) error {
	zero := int64(0)
	for name := range n.uids {
		if err := n.w.CP.Client.CoreV1().Pods(n.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			return fmt.Errorf("delete pod %s/%s: %w", n.ns, name, err)
		}
	}
	n.uids = nil
	return nil
}

// running is how many of the node's pods its kubelet runs (by name and
// UID), and the names of those it does not.
func (n *node) running(ctx context.Context) (int, []string, error) {
	pods, err := n.k.RunningPods(ctx)
	if err != nil {
		return 0, nil, err
	}
	var missing []string
	for name, uid := range n.uids {
		if pods[n.ns+"/"+name] != uid {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	return len(n.uids) - len(missing), missing, nil
}

// runResult is how long the kubelet took to run every pod, or how many
// it ran within the bound and why not the others.
type runResult struct {
	all     bool
	took    time.Duration // from the kubelet's start to every pod running
	ran     int
	pods    int
	missing []string
	reasons []string // the first reasons the kubelet logged for the missing pods
}

func (r runResult) String() string {
	if r.all {
		return fmt.Sprintf("%.1f s", r.took.Seconds())
	}
	return fmt.Sprintf("not all pods ran within %v: %d of %d", r.took.Round(time.Second), r.ran, r.pods)
}

// seconds is the figure of the summary line: "-" when not every pod ran.
func (r runResult) seconds() string {
	if !r.all {
		return "-"
	}
	return fmt.Sprintf("%.1f", r.took.Seconds())
}

// waitRunning polls the kubelet's /runningpods/ until every pod runs or
// bound has passed since start.
func (n *node) waitRunning(ctx context.Context, start time.Time, bound time.Duration) (runResult, error) {
	r := runResult{pods: len(n.uids)}
	for {
		if n.k.Exited() {
			return r, fmt.Errorf("the kubelet of %s exited:\n%s", n.e.Name, benchkit.Tail(n.k.Log(), 3000))
		}
		ran, missing, err := n.running(ctx)
		now := time.Since(start)
		if err == nil {
			r.ran, r.missing = ran, missing
			if len(missing) == 0 {
				r.all, r.took = true, now
				return r, nil
			}
		}
		if now >= bound {
			r.took = bound
			r.reasons = missingReasons(n.k.Log(), n.ns, missing, 3)
			if err != nil && r.ran == 0 {
				r.reasons = append(r.reasons, fmt.Sprintf("(the kubelet's /runningpods/: %v)", err))
			}
			return r, nil
		}
		if err := benchkit.Sleep(ctx, 100*time.Millisecond); err != nil {
			return r, err
		}
	}
}

// Normalising the kubelet's error lines, so that the same reason for
// different pods counts once.
var (
	klogHeader = regexp.MustCompile(`^[EW]\d{4} [0-9:.]+\s+\d+ [^\]]+\] `)
	podNames   = regexp.MustCompile(`till-\d+`)
	uids       = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	volumes    = regexp.MustCompile(`kube-api-access-[a-z0-9]+`)
	timestamps = regexp.MustCompile(`\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}[.0-9]* [-+]\d{4} \w+( m=[-+][0-9.]+)?`)
	durations  = regexp.MustCompile(`\(durationBeforeRetry [^)]*\)`)
)

// hollowNoise are errors the hollow node logs about every pod, running or
// not: its fake runtime has no cgroups.
var hollowNoise = []string{`"failed to read memory cgroup `}

// missingReasons are the kubelet's error and warning lines about the
// missing pods, normalised and counted, most frequent first: at most n.
func missingReasons(log, ns string, missing []string, n int) []string {
	if len(missing) == 0 {
		return nil
	}
	count := map[string]int{}
	first := map[string]int{}
	for i, line := range strings.Split(log, "\n") {
		if !klogHeader.MatchString(line) {
			continue
		}
		about := false
		for _, m := range missing {
			if strings.Contains(line, ns+"/"+m) || strings.Contains(line, `"`+m+`"`) {
				about = true
				break
			}
		}
		if !about {
			continue
		}
		if slices.ContainsFunc(hollowNoise, func(n string) bool { return strings.Contains(line, n) }) {
			continue
		}
		msg := klogHeader.ReplaceAllString(line, "")
		msg = podNames.ReplaceAllString(msg, "till-NN")
		msg = uids.ReplaceAllString(msg, "<uid>")
		msg = volumes.ReplaceAllString(msg, "kube-api-access-*")
		msg = timestamps.ReplaceAllString(msg, "<time>")
		msg = durations.ReplaceAllString(msg, "")
		if _, ok := first[msg]; !ok {
			first[msg] = i
		}
		count[msg]++
	}
	keys := slices.Collect(maps.Keys(count))
	slices.SortFunc(keys, func(a, b string) int {
		if count[a] != count[b] {
			return count[b] - count[a]
		}
		return first[a] - first[b]
	})
	var out []string
	for _, k := range keys[:min(n, len(keys))] {
		msg := k
		if len(msg) > 400 {
			msg = msg[:400] + "..."
		}
		out = append(out, fmt.Sprintf("%d× %s", count[k], msg))
	}
	return out
}
