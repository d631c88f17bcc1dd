package apiproxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	nodev1 "k8s.io/api/node/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/yaml"

	"github.com/tether-edge/tether/internal/localapi"
)

// The API groups whose protobuf the proxy reads: responses of these
// groups pass to the client in protobuf (as kubelet, kube-proxy and
// coredns ask) and are turned into JSON for the cache in the background;
// for other groups the proxy asks the apiserver for JSON. Request bodies
// of offline writes (the node's Lease, pod and node status) and of
// TokenRequests (token.go) are protobuf too. Only the groups node components use are registered, to keep
// tether-edge small.
var (
	scheme   = runtime.NewScheme()
	codecs   serializer.CodecFactory
	protobuf runtime.SerializerInfo
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, coordinationv1.AddToScheme,
		discoveryv1.AddToScheme, storagev1.AddToScheme, nodev1.AddToScheme, authenticationv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	codecs = serializer.NewCodecFactory(scheme)
	protobuf, _ = runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
}

// keepsProtobuf reports whether a request for gv may get its protobuf
// answer as it is: the client accepts protobuf and the proxy can read it.
func keepsProtobuf(r *http.Request, gv schema.GroupVersion) bool {
	return strings.Contains(r.Header.Get("Accept"), runtime.ContentTypeProtobuf) && scheme.IsVersionRegistered(gv)
}

// decoded is a response body as the cache takes it: one object, or the
// items of a list, as JSON.
type decoded struct {
	list bool
	// Kind and APIVersion of the object or of the items.
	kind, apiVersion string
	object           []byte
	// List only.
	rv, cont string
	items    [][]byte
}

// decodeBody reads a JSON or protobuf response body.
func decodeBody(contentType string, body []byte) (decoded, error) {
	if mediaType(contentType) == runtime.ContentTypeProtobuf {
		return decodeProtobuf(body)
	}
	var d decoded
	var l struct {
		Kind       string `json:"kind"`
		APIVersion string `json:"apiVersion"`
		Metadata   struct {
			ResourceVersion string `json:"resourceVersion"`
			Continue        string `json:"continue"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		return d, err
	}
	if !strings.HasSuffix(l.Kind, "List") {
		return decoded{kind: l.Kind, apiVersion: l.APIVersion, object: body}, nil
	}
	d = decoded{list: true, kind: strings.TrimSuffix(l.Kind, "List"), apiVersion: l.APIVersion,
		rv: l.Metadata.ResourceVersion, cont: l.Metadata.Continue, items: make([][]byte, len(l.Items))}
	for i, it := range l.Items {
		d.items[i] = it
	}
	return d, nil
}

func decodeProtobuf(body []byte) (decoded, error) {
	obj, gvk, err := protobuf.Serializer.Decode(body, nil, nil)
	if err != nil {
		return decoded{}, fmt.Errorf("decode protobuf: %w", err)
	}
	if !meta.IsListType(obj) {
		obj.GetObjectKind().SetGroupVersionKind(*gvk)
		b, err := json.Marshal(obj)
		return decoded{kind: gvk.Kind, apiVersion: gvk.GroupVersion().String(), object: b}, err
	}
	lm, err := meta.ListAccessor(obj)
	if err != nil {
		return decoded{}, err
	}
	items, err := meta.ExtractList(obj)
	if err != nil {
		return decoded{}, err
	}
	d := decoded{list: true, kind: strings.TrimSuffix(gvk.Kind, "List"), apiVersion: gvk.GroupVersion().String(),
		rv: lm.GetResourceVersion(), cont: lm.GetContinue(), items: make([][]byte, len(items))}
	for i, it := range items {
		if d.items[i], err = json.Marshal(it); err != nil {
			return decoded{}, err
		}
	}
	return d, nil
}

// protobufEventJSON turns one frame of a protobuf watch stream (a
// metav1.WatchEvent holding the object in protobuf) into the JSON event
// the cache reads.
func protobufEventJSON(frame []byte) ([]byte, error) {
	var ev metav1.WatchEvent
	if err := ev.Unmarshal(frame); err != nil {
		return nil, fmt.Errorf("decode watch event: %w", err)
	}
	obj, gvk, err := protobuf.Serializer.Decode(ev.Object.Raw, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decode watch event object: %w", err)
	}
	obj.GetObjectKind().SetGroupVersionKind(*gvk)
	o, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	return json.Marshal(struct {
		Type   string          `json:"type"`
		Object json.RawMessage `json:"object"`
	}{ev.Type, o})
}

// bodyJSON returns a request body as JSON: JSON as it is, YAML
// converted, protobuf of a registered type decoded and encoded again.
func bodyJSON(contentType string, body []byte) ([]byte, error) {
	switch mt := mediaType(contentType); mt {
	case "", runtime.ContentTypeJSON:
		return body, nil
	case runtime.ContentTypeYAML:
		return yaml.YAMLToJSON(body)
	case runtime.ContentTypeProtobuf:
		obj, gvk, err := protobuf.Serializer.Decode(body, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decode %s body: %w", mt, err)
		}
		obj.GetObjectKind().SetGroupVersionKind(*gvk)
		return json.Marshal(obj)
	default:
		return nil, fmt.Errorf("cannot read a %s body offline", mt)
	}
}

// withStatusOf returns the JSON object base with the status of from: what
// a write to the status subresource changes.
func withStatusOf(base, from []byte) ([]byte, error) {
	var b, f map[string]json.RawMessage
	if err := json.Unmarshal(base, &b); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(from, &f); err != nil {
		return nil, err
	}
	if st, ok := f["status"]; ok {
		b["status"] = st
	} else {
		delete(b, "status")
	}
	return json.Marshal(b)
}

// writeStatus writes a metav1.Status failure, as kube-apiserver does.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, details *metav1.StatusDetails, format string, args ...any) {
	localapi.WriteStatus(w, &apierrors.StatusError{ErrStatus: metav1.Status{
		Status:  metav1.StatusFailure,
		Message: fmt.Sprintf(format, args...),
		Reason:  reason,
		Details: details,
		Code:    int32(code),
	}})
}

// unreachableMessage starts the message of a refusal for want of the
// cloud.
const unreachableMessage = "the cloud kube-apiserver is unreachable"

// unreachable answers a request the proxy cannot serve without the cloud.
func unreachable(w http.ResponseWriter, format string, args ...any) {
	refuse(w, unreachableMessage, format, args...)
}

// refuse answers 503 ServiceUnavailable, saying why the cloud is not
// asked (why) and then what the proxy cannot do about it.
func refuse(w http.ResponseWriter, why, format string, args ...any) {
	writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, nil,
		"tether-edge: "+why+"; "+format, args...)
}

// noAnswer is why a request is served as offline although the health
// checks pass.
func noAnswer(err error) string {
	return fmt.Sprintf("the cloud kube-apiserver did not answer (%v)", err)
}
