// Package serve is a node pool's replica to the node's components: a
// Handler that serves a replica.Store with kube-apiserver's semantics
// (get, list and watch, selectors, resourceVersions, bookmarks), and
// Transport, which runs it in process for the edge's apiserver proxy.
// Requests are read and answers written with internal/localapi, as the
// edge's offline cache does. It knows nothing of how the replica is
// filled (poolstore's README, "Serving").
package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	"k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/poolstore/replica"
)

// Options configure a Handler. Zero values take the defaults.
type Options struct {
	// BookmarkInterval is how often a watch that allows bookmarks is sent
	// one with the resource's resourceVersion (default 10 s).
	BookmarkInterval time.Duration
	// FreshnessWait is how long a list or watch-list for a
	// resourceVersion newer than the replica's waits for the replica to
	// reach it before it is answered "Too large resource version", as
	// kube-apiserver's watch cache does (default 3 s).
	FreshnessWait time.Duration
	Clock         clock.WithTicker
	Logger        *slog.Logger
}

// Handler serves a Store to node components as kube-apiserver serves
// the same resources: get, list and watch, in JSON.
type Handler struct {
	s     *replica.Store
	o     Options
	kinds sync.Map // resource key -> kind learnt from its objects
}

// New returns a Handler serving s.
func New(s *replica.Store, o Options) *Handler {
	if o.BookmarkInterval <= 0 {
		o.BookmarkInterval = 10 * time.Second
	}
	if o.FreshnessWait <= 0 {
		o.FreshnessWait = 3 * time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Handler{s: s, o: o}
}

// Serves reports whether the replica holds resource (a ResourceKey):
// requests for other resources are answered 503.
func (h *Handler) Serves(resource string) bool {
	return h.s.Has(resource)
}

// readRequest is a read of the replica: what an API path and its query
// ask for.
type readRequest struct {
	gvr       schema.GroupVersionResource
	resource  string // ResourceKey(gvr)
	namespace string
	name      string // a get, or a watch of one object
	opts      metainternalversion.ListOptions
	rv        uint64 // opts.ResourceVersion ("" and "0" are 0)
	scope     localapi.Scope
}

// ServeHTTP answers GET (and HEAD) requests for resources of the replica:
//
//	/api/v1[/watch][/namespaces/{ns}]/{resource}[/{name}]
//	/apis/{group}/{version}[/watch][/namespaces/{ns}]/{resource}[/{name}]
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, err := parseReadRequest(r)
	if err != nil {
		localapi.WriteStatus(w, err)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		localapi.WriteStatus(w, apierrors.NewMethodNotSupported(req.gvr.GroupResource(), strings.ToLower(r.Method)))
		return
	}
	if !h.Serves(req.resource) {
		localapi.WriteStatus(w, apierrors.NewServiceUnavailable(fmt.Sprintf(
			"the node pool's replica does not hold %s", req.gvr.GroupResource())))
		return
	}
	switch {
	case req.opts.Watch:
		h.serveWatch(r.Context(), w, req)
	case req.name != "":
		h.serveGet(w, req)
	default:
		h.serveList(r.Context(), w, req)
	}
}

// parseReadRequest reads the path and query of r as kube-apiserver does;
// errors are *apierrors.StatusError.
func parseReadRequest(r *http.Request) (*readRequest, error) {
	api := localapi.ParseRequest(r)
	if !api.IsResource || api.Subresource != "" {
		return nil, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure,
			Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
			Message: "the server could not find the requested resource"}}
	}
	req := &readRequest{gvr: api.GVR, resource: replica.ResourceKey(api.GVR), namespace: api.Namespace, name: api.Name}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(r.URL.Query(), metav1.SchemeGroupVersion, &req.opts); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	req.opts.Watch = req.opts.Watch || api.Verb == localapi.VerbWatch
	if errs := validation.ValidateListOptions(&req.opts, true); len(errs) > 0 {
		return nil, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "", errs)
	}
	if req.opts.Continue != "" {
		return nil, apierrors.NewBadRequest("continue key is not valid: the node pool's replica answers lists in one page")
	}
	if v := req.opts.ResourceVersion; v != "" {
		var err error
		if req.rv, err = strconv.ParseUint(v, 10, 64); err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid resource version %q", v))
		}
	}
	var err error
	if req.scope, err = newScope(req.resource, req.namespace, req.name, req.opts); err != nil {
		return nil, err
	}
	return req, nil
}

// contentFields are, by resource, the fields beyond metadata.name and
// metadata.namespace that kube-apiserver supports in field selectors
// (localapi.Object.Field reads them). kube-proxy lists and watches
// Services with spec.clusterIP!=None.
var contentFields = map[string][]string{
	replica.ResourceKey(schema.GroupVersionResource{Version: "v1", Resource: "services"}): {"spec.clusterIP", "spec.type"},
}

// newScope returns the scope of a request for resource. Field selectors
// may use metadata.name and metadata.namespace, the fields every resource
// supports, and the resource's contentFields; others are refused as
// kube-apiserver refuses fields a resource does not index.
func newScope(resource, namespace, name string, opts metainternalversion.ListOptions) (localapi.Scope, error) {
	sc := localapi.Scope{Namespace: namespace, Labels: opts.LabelSelector, Fields: opts.FieldSelector}.WithName(name)
	if sc.Fields != nil {
		for _, r := range sc.Fields.Requirements() {
			if r.Field != "metadata.name" && r.Field != "metadata.namespace" && !slices.Contains(contentFields[resource], r.Field) {
				return sc, apierrors.NewBadRequest(fmt.Sprintf("field label not supported: %s", r.Field))
			}
		}
	}
	return sc, nil
}

// serveGet answers a get of one object.
func (h *Handler) serveGet(w http.ResponseWriter, req *readRequest) {
	objs, _, _, _ := h.s.List(req.resource)
	i, found := slices.BinarySearchFunc(objs, [2]string{req.namespace, req.name}, func(o localapi.Object, k [2]string) int {
		if c := strings.Compare(o.Namespace, k[0]); c != 0 {
			return c
		}
		return strings.Compare(o.Name, k[1])
	})
	if !found {
		localapi.WriteStatus(w, apierrors.NewNotFound(req.gvr.GroupResource(), req.name))
		return
	}
	localapi.WriteJSON(w, http.StatusOK, objs[i].Raw)
}

// serveList answers a list: the objects in the scope, in one page (limit
// is ignored, as the watch cache does for resourceVersion "0").
func (h *Handler) serveList(ctx context.Context, w http.ResponseWriter, req *readRequest) {
	minRV := req.rv
	if err := h.waitFresh(ctx, req.resource, minRV); err != nil {
		localapi.WriteStatus(w, err)
		return
	}
	objs, rv, _, _ := h.s.List(req.resource)
	if req.opts.ResourceVersionMatch == metav1.ResourceVersionMatchExact && rv != minRV {
		localapi.WriteStatus(w, apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", minRV, rv)))
		return
	}
	objs = slices.DeleteFunc(objs, func(o localapi.Object) bool { return !req.scope.Matches(&o) })
	items := make([][]byte, len(objs))
	for i, o := range objs {
		items[i] = o.Raw
	}
	localapi.WriteList(w, h.kind(req.resource)+"List", req.gvr.GroupVersion().String(), rv, items)
}

// waitFresh waits until the replica's resourceVersion of resource is at
// least minRV, for up to FreshnessWait; then it is the error
// kube-apiserver answers for a resourceVersion it has not seen yet.
func (h *Handler) waitFresh(ctx context.Context, resource string, minRV uint64) error {
	if minRV == 0 {
		return nil
	}
	t := h.o.Clock.NewTimer(h.o.FreshnessWait)
	defer t.Stop()
	for {
		changed := h.s.Changed()
		rv := h.s.Resources()[resource]
		if rv >= minRV {
			return nil
		}
		select {
		case <-changed:
		case <-t.C():
			return tooLargeRV(minRV, rv)
		case <-ctx.Done():
			return apierrors.NewTimeoutError(fmt.Sprintf("waiting for resource version %d: %v", minRV, ctx.Err()), 1)
		}
	}
}

// tooLargeRV is kube-apiserver's error for a resourceVersion newer than
// its cache's (client-go relists from scratch on it).
func tooLargeRV(minRV, current uint64) error {
	err := apierrors.NewTimeoutError(fmt.Sprintf("Too large resource version: %d, current: %d", minRV, current), 1)
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{
		Type:    metav1.CauseTypeResourceVersionTooLarge,
		Message: "Too large resource version",
	}}
	return err
}

// knownKinds are the kinds of the default pool-scope resources, for
// lists and bookmarks of a resource without objects.
var knownKinds = map[string]string{
	"discovery.k8s.io/v1/endpointslices": "EndpointSlice",
	"core/v1/endpoints":                  "Endpoints",
	"core/v1/services":                   "Service",
}

// kind returns the kind of resource's objects: known, or read from one of
// them once, or else guessed from the resource's name.
func (h *Handler) kind(resource string) string {
	if k, ok := knownKinds[resource]; ok {
		return k
	}
	if k, ok := h.kinds.Load(resource); ok {
		return k.(string)
	}
	objs, _, _, _ := h.s.List(resource)
	if len(objs) > 0 {
		var tm metav1.TypeMeta
		if json.Unmarshal(objs[0].Raw, &tm) == nil && tm.Kind != "" {
			h.kinds.Store(resource, tm.Kind)
			return tm.Kind
		}
	}
	name := resource[strings.LastIndexByte(resource, '/')+1:]
	name = strings.TrimSuffix(name, "s")
	if name == "" {
		return "List"
	}
	return strings.ToUpper(name[:1]) + name[1:]
}
