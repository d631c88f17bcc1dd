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
// # Streams the edge opens
//
// The edge opens streams of its own for five things only, each a request
// of its own kind: the gateway checks it, does it (with its own
// credentials), and answers; the edge closes its side after the request,
// the gateway closes the stream after the reply (a pool feed's after the
// feed). The sender is always
// the node of the connection's client certificate, never a name in the
// request. An edge may have at most MaxStreamsToGateway such streams open
// toward one gateway at once; a pool feed holds one of them for as long
// as it lasts, the rest are short. The gateway reads any kind
// (ReadEdgeRequest); each side reads only the kinds it expects on the
// streams it accepts: a connect request on a stream the edge opened, or
// an edge's request on one the gateway opened, is a bad header.
//
// Delegated heartbeats. As its pool's leader, the edge asks the gateway
// to write the Lease renewal of a pool member that lost the cloud
// (DelegateRequest). The gateway answers with a Reply: OK once written,
// or a refusal whose Code says why (NotLeader, LeaderExpired, NotInPool,
// OtherPool, UnknownNode, BadLease, Unavailable, BadRequest, or
// RateLimited: the sender was refused too often of late).
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
// the fixed part).
//
// Election records. A node identity may only read the records of its
// pool's election, the ConfigMaps tether-system/pool-<pool> (who leads)
// and tether-system/pool-<pool>-sync (the leader's sync mark): the edge
// campaigns by asking the gateway to create or update them
// (ElectionRequest). The gateway checks that the sender is in the pool
// and that the record names it (or, for the sync record, that it leads),
// writes the record on the resourceVersion the edge sent, and answers
// with an ElectionReply: a Reply (OK, or Conflict, BadRecord, NotHolder,
// NotLeader, LeaderExpired, NotInPool, OtherPool, UnknownNode,
// Unavailable, BadRequest, RateLimited) and, after OK, the record as stored.
//
// Election request, version 1: the same fixed part, kind 0x03:
//
//	+---------+------+------------+--------------------------------------+
//	| version | kind | length (2) | body: length bytes                   |
//	| 0x01    | 0x03 |            |                                      |
//	+---------+------+------------+--------------------------------------+
//	body := op(1) record(1) pool-length(1) pool(pool-length) configmap(the rest)
//	op: 1 create, 2 update
//	record: 1 the election record (pool-<pool>), 2 the sync record (pool-<pool>-sync)
//	pool: the sender's pool, a label value of 1 to 63 bytes
//	configmap: the record as a core/v1 ConfigMap in JSON, 1 to MaxConfigMapLen bytes
//
// Election reply, version 1: a Reply; after one whose code is OK,
//
//	+------------+------------------------------------+
//	| length (2) | configmap: length bytes            |
//	+------------+------------------------------------+
//	configmap: the record as stored, JSON, 1 to MaxConfigMapLen bytes
//
// An election request is at most MaxElectionRequestLen bytes (64 KiB and
// the fixed part), a reply at most MaxElectionReplyLen.
//
// Liveness probes. A gateway that restarts (kill -9, a node lost) forgets
// its connections; it answers a packet of a connection it does not know
// with a QUIC stateless reset (its reset key, tunnel.StatelessResetKey,
// survives the restart), which closes the edge's connection at once. But
// quic-go sends one only in answer to a packet longer than 42 bytes, and
// the keepalive PINGs are shorter: an idle edge would wait out the whole
// idle timeout. So an edge that has received nothing from a replica for
// half a keepalive period longer than quic-go waits before its PING (that
// PING went unanswered) sends a probe on a stream of its own, padded to
// well over 42 bytes, and again while the silence lasts. A restarted
// gateway answers it with a stateless reset and the edge reconnects
// within about one and a half keepalive periods; a live one
// answers with an OK Reply. An older gateway answers BadRequest (any
// answer says it is alive); one that lets the edge open no stream gets no
// probe.
//
// Probe request, version 1: the same fixed part, kind 0x04:
//
//	+---------+------+------------+--------------------------------------+
//	| version | kind | length (2) | body: length bytes, padding, ignored |
//	| 0x01    | 0x04 |            |                                      |
//	+---------+------+------------+--------------------------------------+
//
// A probe's body is ProbePadding bytes when sent, at most 255 when read.
//
// Pool feeds. As its pool's leader, the edge asks a gateway replica for
// its pool's data (PoolFeedRequest): the pool-scope resources the replica
// list/watches, with statements signed by its serving key (package
// poolstore/feed), which the leader relays to its pool's members and they
// verify. The gateway checks that the sender leads the pool and answers
// with a Reply (OK, or NotLeader, LeaderExpired, NotInPool, OtherPool,
// UnknownNode, Unavailable, BadRequest); after OK the stream carries the
// feed (feed.Writer's frames, deflated) until the edge ends it or the
// sender no longer leads (checked again every few seconds), when the
// gateway ends it.
//
// Pool feed request, version 1: the same fixed part, kind 0x05:
//
//	+---------+------+------------+--------------------------------------+
//	| version | kind | length (2) | body: length bytes                   |
//	| 0x01    | 0x05 |            |                                      |
//	+---------+------+------------+--------------------------------------+
//	body := pool-length(1) pool(pool-length) reserved(the rest, skipped)
//	pool: the sender's pool, a label value of 1 to 63 bytes
//
// A pool feed request is at most MaxPoolFeedRequestLen bytes.
//
// Services. A pod of the edge's node connects to a cloud Service the
// operator marked for edge access (annotation tether.io/edge-access); the
// edge asks a gateway replica for a connection to it (ServiceRequest),
// naming the Service and its port, never an address. The gateway dials
// one of the Service's ready endpoints on a cloud node and answers with a
// Reply (OK, or NotMarked, NoEndpoints, DialFailed, Overloaded,
// RateLimited, BadRequest); after OK the stream carries the connection's
// bytes both ways (Relay), as a connect stream does the other way.
//
// Service request, version 1: the same fixed part, kind 0x06:
//
//	+---------+------+------------+--------------------------------------+
//	| version | kind | length (2) | body: length bytes                   |
//	| 0x01    | 0x06 |            |                                      |
//	+---------+------+------------+--------------------------------------+
//	body := ns-length(1) namespace name-length(1) name port(2) reserved(the rest, skipped)
//	namespace, name: the Service's, DNS-1123 labels of 1 to 63 bytes
//	port: the Service's port (spec.ports[].port), TCP, not 0
//
// A service request is at most MaxServiceRequestLen bytes.
//
// # Receive windows
//
// What a peer sent and the application has not read waits in memory, up
// to the QUIC receive windows: per stream 512 KiB, grown by quic-go's
// auto-tuning up to 4 MiB; per connection 768 KiB up to 8 MiB (the
// constants in quic.go, chosen from BenchmarkBulkWindow). A
// ReceiveBudget bounds the growth of all of a process's connections
// together (the gateway's --max-receive-memory): the receive buffers of
// N connections then hold at most N x 768 KiB + the budget.
// README.md has the measurements and the formula.
package tunnel
