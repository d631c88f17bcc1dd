package poolstore

import (
	"context"
	"encoding/json"
	"errors"
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
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/utils/clock"
)

// HandlerOptions configure a Handler. Zero values take the defaults.
type HandlerOptions struct {
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
	s     *Store
	o     HandlerOptions
	kinds sync.Map // resource key -> kind learnt from its objects
}

// NewHandler returns a Handler serving s.
func NewHandler(s *Store, o HandlerOptions) *Handler {
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
	scope     readScope
}

// ServeHTTP answers GET (and HEAD) requests for resources of the replica:
//
//	/api/v1[/watch][/namespaces/{ns}]/{resource}[/{name}]
//	/apis/{group}/{version}[/watch][/namespaces/{ns}]/{resource}[/{name}]
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, err := parseReadRequest(r)
	if err != nil {
		writeAPIStatus(w, err)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeAPIStatus(w, apierrors.NewMethodNotSupported(req.gvr.GroupResource(), strings.ToLower(r.Method)))
		return
	}
	if !h.Serves(req.resource) {
		writeAPIStatus(w, apierrors.NewServiceUnavailable(fmt.Sprintf(
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
	req, watchPath, ok := parseAPIPath(r.URL.Path)
	if !ok {
		return nil, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure,
			Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
			Message: "the server could not find the requested resource"}}
	}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(r.URL.Query(), metav1.SchemeGroupVersion, &req.opts); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	req.opts.Watch = req.opts.Watch || watchPath
	if errs := validation.ValidateListOptions(&req.opts, true); len(errs) > 0 {
		return nil, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "", errs)
	}
	if req.opts.Continue != "" {
		return nil, apierrors.NewBadRequest("continue key is not valid: the node pool's replica answers lists in one page")
	}
	if _, err := parseRV(req.opts.ResourceVersion); err != nil {
		return nil, err
	}
	var err error
	if req.scope, err = newScope(req.resource, req.namespace, req.name, req.opts); err != nil {
		return nil, err
	}
	return req, nil
}

// parseAPIPath splits an API path into resource, namespace and name;
// watchPath is true for the deprecated /watch/ paths. ok is false for
// anything else (subresources, discovery).
func parseAPIPath(p string) (req *readRequest, watchPath, ok bool) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	var gv schema.GroupVersion
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		gv, parts = schema.GroupVersion{Version: parts[1]}, parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		gv, parts = schema.GroupVersion{Group: parts[1], Version: parts[2]}, parts[3:]
	default:
		return nil, false, false
	}
	if parts[0] == "watch" {
		watchPath, parts = true, parts[1:]
	}
	req = &readRequest{}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		req.namespace, parts = parts[1], parts[2:]
	}
	if len(parts) == 0 || len(parts) > 2 || parts[0] == "" {
		return nil, false, false
	}
	req.gvr = gv.WithResource(parts[0])
	req.resource = ResourceKey(req.gvr)
	if len(parts) == 2 {
		req.name = parts[1]
	}
	return req, watchPath, true
}

// parseRV reads a resourceVersion parameter: "" and "0" are 0.
func parseRV(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, apierrors.NewBadRequest(fmt.Sprintf("invalid resource version %q", s))
	}
	return n, nil
}

// readScope is what a list or watch covers.
type readScope struct {
	namespace string
	labels    labels.Selector // nil: all
	fields    fields.Selector // nil: all; metadata.name and metadata.namespace only
	// content are the field selector's requirements on the object's
	// content (contentFields), which, like labels, can change.
	content []contentRequirement
}

// contentRequirement is a field selector's requirement on a content
// field, with the field's JSON path.
type contentRequirement struct {
	fields.Requirement
	path []string
}

// contentFields are, by resource, the fields beyond metadata.name and
// metadata.namespace that kube-apiserver supports in field selectors,
// with their JSON path in the object. kube-proxy lists and watches
// Services with spec.clusterIP!=None.
var contentFields = map[string]map[string][]string{
	ResourceKey(schema.GroupVersionResource{Version: "v1", Resource: "services"}): {
		"spec.clusterIP": {"spec", "clusterIP"},
		"spec.type":      {"spec", "type"},
	},
}

// newScope returns the scope of a request for resource. Field selectors
// may use metadata.name and metadata.namespace, the fields every resource
// supports, and the resource's contentFields; others are refused as
// kube-apiserver refuses fields a resource does not index.
func newScope(resource, namespace, name string, opts metainternalversion.ListOptions) (readScope, error) {
	sc := readScope{namespace: namespace}
	if opts.LabelSelector != nil && !opts.LabelSelector.Empty() {
		sc.labels = opts.LabelSelector
	}
	fs := opts.FieldSelector
	if name != "" {
		nameSel := fields.OneTermEqualSelector("metadata.name", name)
		if fs == nil {
			fs = nameSel
		} else {
			fs = fields.AndSelectors(fs, nameSel)
		}
	}
	if fs == nil || fs.Empty() {
		return sc, nil
	}
	var keys []fields.Selector
	for _, r := range fs.Requirements() {
		switch {
		case r.Field == "metadata.name" || r.Field == "metadata.namespace":
			keys = append(keys, requirementSelector(r))
		case contentFields[resource][r.Field] != nil:
			sc.content = append(sc.content, contentRequirement{r, contentFields[resource][r.Field]})
		default:
			return sc, apierrors.NewBadRequest(fmt.Sprintf("field label not supported: %s", r.Field))
		}
	}
	if len(keys) > 0 {
		sc.fields = fields.AndSelectors(keys...)
	}
	return sc, nil
}

// requirementSelector is the selector of one requirement (a field
// selector's requirements use =, == or !=).
func requirementSelector(r fields.Requirement) fields.Selector {
	if r.Operator == selection.NotEquals {
		return fields.OneTermNotEqualSelector(r.Field, r.Value)
	}
	return fields.OneTermEqualSelector(r.Field, r.Value)
}

// filtersContent reports whether the scope depends on what can change
// in an object (labels, content fields), not only on its key.
func (sc readScope) filtersContent() bool { return sc.labels != nil || len(sc.content) > 0 }

// matchesContent reports whether an object with labels l and JSON raw
// matches the scope's label selector and content fields.
func (sc readScope) matchesContent(l map[string]string, raw json.RawMessage) bool {
	if sc.labels != nil && !sc.labels.Matches(labels.Set(l)) {
		return false
	}
	if len(sc.content) == 0 {
		return true
	}
	var obj map[string]any
	if json.Unmarshal(raw, &obj) != nil {
		return false
	}
	for _, r := range sc.content {
		v := jsonString(obj, r.path)
		if (v == r.Value) == (r.Operator == selection.NotEquals) {
			return false
		}
	}
	return true
}

// jsonString is the string at path in obj, or "" (absent fields select
// as empty, as kube-apiserver's field sets have them).
func jsonString(obj map[string]any, path []string) string {
	var v any = obj
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = m[k]
	}
	s, _ := v.(string)
	return s
}

// matchesKey reports whether an object's namespace and name are in the
// scope; they never change, so neither does the answer.
func (sc readScope) matchesKey(namespace, name string) bool {
	if sc.namespace != "" && namespace != sc.namespace {
		return false
	}
	return sc.fields == nil || sc.fields.Matches(objectFields{namespace, name})
}

func (sc readScope) matches(o *Object) bool {
	return sc.matchesKey(o.Namespace, o.Name) && sc.matchesContent(o.Labels, o.Raw)
}

// objectFields are the fields of an object a field selector may use
// (fields.Fields, without a map per object).
type objectFields struct{ namespace, name string }

func (f objectFields) Has(field string) bool {
	return field == "metadata.name" || field == "metadata.namespace"
}

func (f objectFields) Get(field string) string {
	switch field {
	case "metadata.name":
		return f.name
	case "metadata.namespace":
		return f.namespace
	}
	return ""
}

// serveGet answers a get of one object.
func (h *Handler) serveGet(w http.ResponseWriter, req *readRequest) {
	objs, _, _, _ := h.s.List(req.resource)
	i, found := slices.BinarySearchFunc(objs, [2]string{req.namespace, req.name}, func(o Object, k [2]string) int {
		if c := strings.Compare(o.Namespace, k[0]); c != 0 {
			return c
		}
		return strings.Compare(o.Name, k[1])
	})
	if !found {
		writeAPIStatus(w, apierrors.NewNotFound(req.gvr.GroupResource(), req.name))
		return
	}
	writeAPIObject(w, http.StatusOK, objs[i].Raw)
}

// serveList answers a list: the objects in the scope, in one page (limit
// is ignored, as the watch cache does for resourceVersion "0").
func (h *Handler) serveList(ctx context.Context, w http.ResponseWriter, req *readRequest) {
	minRV, _ := parseRV(req.opts.ResourceVersion)
	if err := h.waitFresh(ctx, req.resource, minRV); err != nil {
		writeAPIStatus(w, err)
		return
	}
	objs, rv, _, _ := h.s.List(req.resource)
	if req.opts.ResourceVersionMatch == metav1.ResourceVersionMatchExact && rv != minRV {
		writeAPIStatus(w, apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", minRV, rv)))
		return
	}
	objs = slices.DeleteFunc(objs, func(o Object) bool { return !req.scope.matches(&o) })
	head := fmt.Appendf(nil, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"%d"},"items":[`,
		h.kind(req.resource)+"List", req.gvr.GroupVersion().String(), rv)
	n := len(head) + len(listTail) + max(len(objs)-1, 0)
	for _, o := range objs {
		n += len(o.Raw)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(n))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(head); err != nil {
		return
	}
	for i, o := range objs {
		if i > 0 {
			w.Write(comma)
		}
		if _, err := w.Write(o.Raw); err != nil {
			return
		}
	}
	w.Write(listTail)
}

var (
	comma    = []byte{','}
	listTail = []byte("]}\n")
)

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

// writeAPIObject writes a JSON answer.
func writeAPIObject(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	w.Write(body)
}

// writeAPIStatus writes err as kube-apiserver writes a failure: a
// metav1.Status with the error's code.
func writeAPIStatus(w http.ResponseWriter, err error) {
	st := statusOf(err)
	b, _ := json.Marshal(st)
	writeAPIObject(w, int(st.Code), b)
}

// statusOf returns err as a metav1.Status, with its type meta.
func statusOf(err error) metav1.Status {
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		se = apierrors.NewInternalError(err)
	}
	st := se.ErrStatus
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	return st
}
