// Package edgetunnel is the edge half of the tunnel: it keeps one QUIC
// connection to every gateway replica, accepts the streams the gateways
// open, checks each requested destination against the node's allow list,
// dials it and relays bytes (the wire protocol is package tunnel's). As
// its pool's leader it also opens streams of its own on them to pass on
// pool members' Lease renewals (Client.DelegateHeartbeat), and as a
// member to have its pool's election records written
// (Client.WriteElectionRecord), which node identities may only read.
//
// Lifetimes: Client.Run re-resolves the --gateway entries and runs one
// supervisor per resolved replica address; a supervisor dials, serves the
// connection until it dies, waits a jittered, growing backoff and dials
// again. A connection's life is an errgroup: the accept loop and one
// goroutine per stream, all ended when the connection ends.
package edgetunnel
