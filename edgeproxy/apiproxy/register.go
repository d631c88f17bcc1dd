package apiproxy

import (
	"net/http"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/internal/localapi"
)

// A kubelet started while the cloud is unreachable registers its Node and
// initialises its CSINode before anything else it writes. Upstream
// kubelet (k8s.io/kubernetes v1.36, docs/proposals/offline-kubelet.md
// §2-3):
//
//   - registerWithAPIServer retries POST nodes until it gets 201, or 409
//     AlreadyExists (then it reads the Node and is registered); while it
//     retries, no node status is computed, sent or queued.
//   - initializeCSINode polls GET csinodes/<node> until it gets 200 or
//     404; after a 404 it creates the CSINode, and if that fails for
//     about 140 s the kubelet exits.
//
//   - the Lease controller starts with GET of the node's Lease; until that
//     answers (404 leads to a create), it renews nothing.
//
// So offline, the proxy answers a create of this node's Node, when the
// component cached it, 409 AlreadyExists as the apiserver would; a get of
// this node's CSINode that is not cached 503, never 404; and online it
// caches the answers to the component's create of its Node, create or
// update of its CSINode and create of its node Lease, so that a next start
// offline finds them (a kubelet cut before its first renewal would
// otherwise find no Lease, and renew nothing, not even through its pool).

var csiNodesGVR = schema.GroupVersionResource{Group: "storage.k8s.io", Version: "v1", Resource: "csinodes"}

// isRegistration reports whether req creates a Node or a node Lease, or
// creates or updates a CSINode: the writes a kubelet makes to register
// (kindRegister when the component is cached).
func isRegistration(req localapi.Request) bool {
	if !req.IsResource || req.Subresource != "" {
		return false
	}
	switch req.GVR {
	case nodesGVR:
		return req.Verb == localapi.VerbCreate
	case csiNodesGVR:
		return req.Verb == localapi.VerbCreate || req.Verb == localapi.VerbUpdate
	case leasesGVR:
		return req.Verb == localapi.VerbCreate && req.Namespace == corev1.NamespaceNodeLease
	}
	return false
}

// register relays a registration write of a cached component and caches
// its 2xx answer. Offline, or when the cloud does not answer, a create of
// this node's Node that the component cached is answered 409
// AlreadyExists; anything else is refused (503).
func (p *Proxy) register(w http.ResponseWriter, r *http.Request, req request, healthy bool) string {
	body, err := readBody(r)
	if err != nil {
		writeStatus(w, http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge, nil, "%v", err)
		return servedError
	}
	why := unreachableMessage
	if healthy {
		resp, err := p.rt.RoundTrip(p.upstreamRequest(r, body, clientAndCache, req.GVR.GroupVersion()))
		if err == nil {
			defer resp.Body.Close()
			if b := p.relay(w, resp, answerFor(resp.StatusCode < 300)); b != nil {
				go p.cacheResponse(req, false, resp.Header.Get("Content-Type"), b)
			}
			return servedUpstream
		}
		if r.Context().Err() != nil {
			return servedError
		}
		p.up.Kick()
		p.log.Debug("apiserver did not answer a registration write", "component", req.comp, "path", r.URL.Path, "err", err)
		why = noAnswer(err)
	}
	if req.GVR == nodesGVR {
		if name := p.registeredNode(r, req, body); name != "" {
			localapi.WriteStatus(w, apierrors.NewAlreadyExists(nodesGVR.GroupResource(), name))
			return servedLocal
		}
	}
	refuse(w, why, "%s of %s is not possible offline", req.Verb, describe(req, r))
	return servedRefused
}

// registeredNode is the name of the Node that a create of a Node (body)
// names, if it is this node's and req's component has it cached; "" if
// not. POST nodes has no name on its URL: kubelet sends it in protobuf.
func (p *Proxy) registeredNode(r *http.Request, req request, body []byte) string {
	if p.node == "" {
		return ""
	}
	j, err := bodyJSON(r.Header.Get("Content-Type"), body)
	if err != nil {
		return ""
	}
	sent, err := localapi.DecodeObject(j, "", "")
	if err != nil || sent.Name != p.node {
		return ""
	}
	if o, err := p.store.Get(req.comp, nodesGVR, "", sent.Name); err != nil || o == nil {
		return ""
	}
	return sent.Name
}

// ownCSINode reports whether req reads this node's CSINode. Offline, when
// it is not cached, it is refused (503), not answered 404: after a 404
// kubelet creates it, and a create that fails for about 140 s makes the
// kubelet exit, while a 503 has it poll again.
func (p *Proxy) ownCSINode(req request) bool {
	return p.node != "" && req.Verb == localapi.VerbGet && req.GVR == csiNodesGVR && req.Name == p.node
}
