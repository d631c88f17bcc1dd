// Package tunnel is the wire protocol shared by tether-gateway and
// tether-edge: how the QUIC connection is set up, what the first bytes of a
// stream say, and how bytes are relayed between a TCP connection and a QUIC
// stream. It knows neither side.
//
// # Connection
//
// The edge dials the gateway over QUIC (ALPN "tether/1", TLS 1.3, mutual
// authentication). The edge's identity is the node name in its client
// certificate, CN=system:node:<name> with O=system:nodes (see NodeName).
//
// # Streams
//
// The gateway opens one bidirectional stream per proxied TCP connection.
// It writes a Request; the edge checks it, dials, and writes a Reply. After
// an OK reply both sides relay bytes with half-close (Relay). A refusal is
// a Reply with a Code other than OK, after which the stream is closed.
// The gateway may send the client's bytes right after the request, without
// waiting for the reply: the edge reads exactly the request, relays what
// follows once it has dialled, and discards it when it refuses.
//
// Request, version 1 (big-endian):
//
//	+---------+------+------------+--------------------------------------+
//	| version | kind | length (2) | body: length bytes                   |
//	| 0x01    | 0x01 |            |                                      |
//	+---------+------+------------+--------------------------------------+
//	body := family(1: 4 or 6) address(4 or 16) port(2) field*
//	field := type(1) length(1) value(length)   unknown types are skipped
//	field type 1: the cloud client's address, text, for the edge's logs
//
// Reply, version 1:
//
//	+---------+------+-------------+-----------------------+
//	| version | code | length (1)  | message: length bytes |
//	+---------+------+-------------+-----------------------+
//
// A whole request is at most MaxRequestLen bytes; a reader never reads
// more than that before deciding, so a peer cannot make it buffer more.
//
// # Delegated heartbeats
//
// The edge opens a stream of its own for one thing only: as its pool's
// leader, it asks the gateway to write the Lease renewal of a pool member
// that lost the cloud (DelegateRequest). The gateway checks it, writes the
// Lease and answers with a Reply: OK, or a refusal whose Code says why
// (NotLeader, LeaderExpired, NotInPool, OtherPool, UnknownNode, BadLease,
// Unavailable, BadRequest). The edge closes its side after the request;
// the gateway closes the stream after the reply. An edge may have at most
// MaxStreamsToGateway such streams open toward one gateway at once.
//
// Delegate request, version 1: the same fixed part, kind 0x02:
//
//	+---------+------+------------+--------------------------------------+
//	| version | kind | length (2) | body: length bytes                   |
//	| 0x01    | 0x02 |            |                                      |
//	+---------+------+------------+--------------------------------------+
//	body := node-length(1) node(node-length) lease(the rest)
//	node: the delegated node's name (a DNS-1123 subdomain)
//	lease: its coordination.k8s.io/v1 Lease as JSON, 1 to MaxLeaseLen bytes
//
// A delegate request is at most MaxDelegateRequestLen bytes (64 KiB and
// the fixed part). Each side reads only the kind it expects on the
// streams it accepts: a connect request on a stream the edge opened, or a
// delegate request on one the gateway opened, is a bad header.
package tunnel
