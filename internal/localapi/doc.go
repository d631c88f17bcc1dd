// Package localapi is what tether-edge needs to answer a node
// component's read as kube-apiserver would, from a store of its own:
// the request path parsed into verb, resource and object (ParseRequest),
// the objects a store holds (Object, DecodeObject, ParseRV), the scope of
// a list or watch and its matching (Scope), and the bytes of
// the answers: list envelopes (WriteList), watch events and bookmarks
// (AppendEvent, AppendBookmark), and metav1.Status failures (WriteStatus,
// AppendErrorEvent for the ERROR event of a 410 Gone).
//
// Two stores use it: the edge's offline cache (edgeproxy/cache, served by
// edgeproxy/apiproxy when the cloud is away) and the node pool's replica
// (poolstore/replica, served by poolstore/serve's Handler). README.md
// holds both stores' bucket schemas.
//
// The package is a leaf: it imports neither program, nor internal/cli,
// nor a store (internal/layering checks it), so that both sides read one
// definition of the API's wire form.
package localapi
