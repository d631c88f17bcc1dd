package world

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
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
	// LocalVolume adds a pod whose data lives on a PersistentVolume of a
	// local storage class on the node (the kubelet reads its claim and
	// the volume from the API before mounting it).
	LocalVolume bool
}

// LocalVolumePod is the name of the pod with the local volume.
const LocalVolumePod = "till-disk"

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
	if o.LocalVolume {
		if err := createLocalVolume(ctx, c, ns, o.Node); err != nil {
			return nil, err
		}
		pod := WorkloadPod(LocalVolumePod, o)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "disk", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "till-disk"}}})
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "disk", MountPath: "/var/till"})
		p, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("create pod %s in %s: %w", LocalVolumePod, ns, err)
		}
		uids[p.Name] = p.UID
	}
	for i := range o.Pods {
		p, err := c.CoreV1().Pods(ns).Create(ctx, WorkloadPod(fmt.Sprintf("till-%02d", i), o), metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("create pod %d in %s: %w", i, ns, err)
		}
		uids[p.Name] = p.UID
	}
	return uids, nil
}

// WorkloadPod is one pod of the workload: ConfigMap and Secret volumes,
// env from both, a downward API volume and, unless o.NoToken, the default
// service-account token; bound to o.Node, in o.Namespace.
func WorkloadPod(name string, o WorkloadOptions) *corev1.Pod {
	ns := o.Namespace
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

// createLocalVolume makes a local PersistentVolume on node and a claim
// bound to it, marked Bound as the volume binder would.
func createLocalVolume(ctx context.Context, c kubernetes.Interface, ns, node string) error {
	class := "local-disk"
	mode := storagev1.VolumeBindingWaitForFirstConsumer
	_, err := c.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: class},
		Provisioner: "kubernetes.io/no-provisioner", VolumeBindingMode: &mode}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create storage class: %w", err)
	}
	pvName := ns + "-till-disk"
	size := resource.MustParse("1Gi")
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              class,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/mnt/till-disk"}},
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: "till-disk"},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "till-disk", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			VolumeName:       pvName,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	pvc, err = c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create claim: %w", err)
	}
	pv.Spec.ClaimRef.UID = pvc.UID
	if pv, err = c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create local volume: %w", err)
	}
	pvc.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound,
		AccessModes: pvc.Spec.AccessModes, Capacity: corev1.ResourceList{corev1.ResourceStorage: size}}
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("bind claim: %w", err)
	}
	pv.Status.Phase = corev1.VolumeBound
	if _, err := c.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("bind local volume: %w", err)
	}
	return nil
}
