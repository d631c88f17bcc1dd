package apiproxy

import (
	"bytes"
	"encoding/json"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// A Lease kubelet renews itself after the gateway had written it for the
// node (delegated) goes upstream without the annotation; one without it
// goes as it came.
func TestWithoutDelegateAnnotation(t *testing.T) {
	lease := &coordinationv1.Lease{
		TypeMeta: metav1.TypeMeta{Kind: "Lease", APIVersion: "coordination.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "kube-node-lease", ResourceVersion: "7",
			Annotations: map[string]string{DelegateHeartbeatAnnotation: "true", "keep": "me"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("n")},
	}
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	var pb bytes.Buffer
	if err := info.Serializer.Encode(lease, &pb); err != nil {
		t.Fatal(err)
	}
	out := withoutDelegateAnnotation(runtime.ContentTypeProtobuf, pb.Bytes())
	var got coordinationv1.Lease
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if _, ok := got.Annotations[DelegateHeartbeatAnnotation]; ok || got.Annotations["keep"] != "me" ||
		got.ResourceVersion != "7" || *got.Spec.HolderIdentity != "n" {
		t.Fatalf("stripped Lease: %+v", got)
	}

	delete(lease.Annotations, DelegateHeartbeatAnnotation)
	plain, _ := json.Marshal(lease)
	if out := withoutDelegateAnnotation("application/json", plain); out != nil {
		t.Fatalf("a Lease without the annotation was rewritten: %s", out)
	}
}
