package world

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// WorkloadOptions shape the pods CreateWorkload binds to a node.
type WorkloadOptions struct {
	Namespace string
	Node      string
	// Pods is the number of pods; each has ConfigMap and Secret volumes,
	// env from both, a downward API volume and, unless NoToken, the
	// service-account token Kubernetes mounts into every pod by default
	// (a projected volume: the kubelet asks the cloud for the token).
	Pods    int
	NoToken bool
}

// CreateWorkload creates what a namespace has in a real cluster before
// its pods run — the default ServiceAccount and kube-root-ca.crt, which
// kube-controller-manager's controllers would make — plus a ConfigMap, a
// Secret and the pods, bound to the node (no scheduler runs). It returns
// the pods' UIDs by name.
func CreateWorkload(ctx context.Context, c kubernetes.Interface, caPEM []byte, o WorkloadOptions) (map[string]types.UID, error) {
	ns := o.Namespace
	create := func(what string, err error) error {
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s in %s: %w", what, ns, err)
		}
		return nil
	}
	meta := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: ns} }
	_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err := create("namespace", err); err != nil {
		return nil, err
	}
	_, err = c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: meta("default")}, metav1.CreateOptions{})
	if err := create("service account", err); err != nil {
		return nil, err
	}
	_, err = c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: meta("kube-root-ca.crt"),
		Data: map[string]string{"ca.crt": string(caPEM)}}, metav1.CreateOptions{})
	if err := create("kube-root-ca.crt", err); err != nil {
		return nil, err
	}
	_, err = c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: meta("app-config"),
		Data: map[string]string{"mode": "offline-first"}}, metav1.CreateOptions{})
	if err := create("configmap", err); err != nil {
		return nil, err
	}
	_, err = c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: meta("app-secret"),
		StringData: map[string]string{"password": "shop-till"}}, metav1.CreateOptions{})
	if err := create("secret", err); err != nil {
		return nil, err
	}
	uids := map[string]types.UID{}
	for i := range o.Pods {
		p, err := c.CoreV1().Pods(ns).Create(ctx, workloadPod(fmt.Sprintf("till-%02d", i), ns, o), metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("create pod %d in %s: %w", i, ns, err)
		}
		uids[p.Name] = p.UID
	}
	return uids, nil
}

func workloadPod(name, ns string, o WorkloadOptions) *corev1.Pod {
	automount := !o.NoToken
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "till"}},
		Spec: corev1.PodSpec{
			NodeName:                     o.Node,
			AutomountServiceAccountToken: &automount,
			Tolerations: []corev1.Toleration{
				// The hollow node's fake runtime has no images to pull.
				{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
			},
			Containers: []corev1.Container{{
				Name:  "till",
				Image: "registry.invalid/till:1",
				Env: []corev1.EnvVar{
					{Name: "MODE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
						LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}, Key: "mode"}}},
					{Name: "PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
						LocalObjectReference: corev1.LocalObjectReference{Name: "app-secret"}, Key: "password"}}},
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "config", MountPath: "/etc/till"},
					{Name: "secret", MountPath: "/etc/till-secret"},
					{Name: "podinfo", MountPath: "/etc/podinfo"},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}}}},
				{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "app-secret"}}},
				{Name: "podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
					Items: []corev1.DownwardAPIVolumeFile{{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}}}},
			},
		},
	}
}
