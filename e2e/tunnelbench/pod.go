package main

// The pod mode (issue 31): the cloud client reaches the same stand-in
// server at a pod address of the edge node, through the gateway's
// --edge-pod-cidrs and the edge's allow list of its node's pods, beside
// the tunnel mode that reaches it by the node's address.

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

const (
	podMode = "pod"
	// podName is the Pod object of the stand-in, in namespace default.
	podName = "tunnelbench-pod"
	// podHostNum and podGatewayNum place the stand-in pod and the edge
	// host's end of its link (a CNI bridge's address) in the edge's pod
	// range: .5 and .1.
	podHostNum    = 5
	podGatewayNum = 1
	// podLink is the edge host's end of the pod's veth pair.
	podLink = "vethpod"
)

// startPod does on e's host what a CNI and a kubelet would: a network
// namespace linked to the edge host by a veth pair, holding an address
// of e's pod range (Node spec.podCIDRs, written by the admin), with the
// same stand-in TLS server as the node's (world.StartKubelet) listening
// there; then a Pod object bound to e declaring that port, with the
// status a kubelet would write (Running, podIPs), written by the admin.
// The edge's allow list reads exactly that pod. It returns the
// stand-in's URL, https://<pod address>:<port>, and the pod's namespace
// (the service mode's client runs there).
func startPod(ctx context.Context, s *testenv.Session, w *world.World, e *world.Edge) (string, *testenv.Host, error) {
	if !e.PodCIDR.IsValid() {
		return "", nil, fmt.Errorf("edge %s has no pod range (world.Options.PodCIDRs)", e.Name)
	}
	gwAddr, podAddr := nth(e.PodCIDR, podGatewayNum), nth(e.PodCIDR, podHostNum)
	h := testenv.NewHost(s, e.Name+"-pod")
	h.Label, h.Addr = podName, podAddr
	bits := strconv.Itoa(e.PodCIDR.Bits())
	e.Host.Run(s, "ip", "link", "add", podLink, "type", "veth", "peer", "name", "eth0", "netns", h.Name)
	e.Host.Run(s, "ip", "addr", "add", gwAddr.String()+"/"+bits, "dev", podLink)
	e.Host.Run(s, "ip", "link", "set", podLink, "up")
	h.Run(s, "ip", "addr", "add", podAddr.String()+"/"+bits, "dev", "eth0")
	h.Run(s, "ip", "link", "set", "eth0", "up")
	h.Run(s, "ip", "route", "add", "default", "via", gwAddr.String())
	k := world.StartKubelet(s, h, podName, w.KubeletCA)

	c := w.CP.Client.CoreV1()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := c.ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", nil, fmt.Errorf("create service account default: %w", err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: "default", Labels: map[string]string{"app": podName}},
		Spec: corev1.PodSpec{
			NodeName:                     e.Name,
			AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{
				// Nothing runs it: the stand-in above is its container.
				Name: "server", Image: "tunnelbench/stand-in", ImagePullPolicy: corev1.PullNever,
				Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: world.KubeletPort, Protocol: corev1.ProtocolTCP}},
			}},
		},
	}
	created, err := c.Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("create pod %s: %w", podName, err)
	}
	now := metav1.NewTime(time.Now())
	created.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    e.Host.Addr.String(),
		HostIPs:   []corev1.HostIP{{IP: e.Host.Addr.String()}},
		PodIP:     podAddr.String(),
		PodIPs:    []corev1.PodIP{{IP: podAddr.String()}},
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	if _, err := c.Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return "", nil, fmt.Errorf("set the status of pod %s: %w", podName, err)
	}
	return "https://" + k.Addr, h, nil
}

// nth is the n-th address of p.
func nth(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a
}
