// Package edgeservice is tether-edge's service listener: it lets the
// pods of this edge node reach cloud Services that an operator marked
// for edge access (annotation tether.io/edge-access, package
// internal/edgeaccess), through the tunnel.
//
// The host's rules (Rules, package netrules' edge table) redirect TCP
// from this node's pod ranges (and from the node itself) to a marked
// ClusterIP and port, before kube-proxy's DNAT, to the listener
// (--service-listen, :10271). The listener admits only clients in the
// node's pod ranges, loopback and the node's own addresses, reads the
// connection's original destination (netrules.OriginalDst), maps it to
// the Service from the marked-Service Index, opens a stream to a gateway
// replica (edgetunnel.Client.DialService) and relays. The gateway picks
// and dials an endpoint of that Service; the edge never names an
// address. See README.md.
package edgeservice
