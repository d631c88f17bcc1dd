package world

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/tether-edge/tether/internal/openyurt"
)

// MarkReady posts a Ready condition for the Node name (creating it if
// needed), as kubelet does when it starts.
func MarkReady(ctx context.Context, c kubernetes.Interface, name string) error {
	if _, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
		if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	// The node lifecycle controller writes the Node too: retry on
	// conflict with the current one.
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now}}
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// NodeCondition is the status of the Node's Ready condition ("True",
// "False", "Unknown"; "" when it has none) and whether it carries the
// taint of delegated heartbeats (node.openyurt.io/unschedulable).
func NodeCondition(ctx context.Context, c kubernetes.Interface, name string) (ready corev1.ConditionStatus, tainted bool, err error) {
	n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", false, err
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			ready = cond.Status
		}
	}
	for _, tn := range n.Spec.Taints {
		if tn.Key == openyurt.UnschedulableTaintKey && tn.Effect == corev1.TaintEffectNoSchedule {
			tainted = true
		}
	}
	return ready, tainted, nil
}

// Served is how many requests of node components e's apiserver proxy has
// answered in the way how ("upstream", "pool", "cache", "local",
// "queued", "refused"), summed over components and verbs
// (tether_edge_apiserver_requests_total).
func (e *Edge) Served(ctx context.Context, how string) (float64, error) {
	body, err := Get(ctx, e.Host, EdgeAdmin("/metrics"))
	if err != nil {
		return 0, err
	}
	total := 0.0
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, "tether_edge_apiserver_requests_total{") && strings.Contains(line, `served="`+how+`"`) {
			v, err := strconv.ParseFloat(strings.TrimSpace(line[strings.LastIndex(line, " ")+1:]), 64)
			if err != nil {
				return 0, fmt.Errorf("metrics of %s: %q: %w", e.Name, line, err)
			}
			total += v
		}
	}
	return total, nil
}
