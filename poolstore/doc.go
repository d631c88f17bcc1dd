// Package poolstore shares pool-scope resources (EndpointSlices,
// Endpoints, Services, ...) inside a node pool: one node, elected on a
// record in the cloud, list/watches them and writes them to its bbolt
// store with a revision; the other nodes replicate that store over the
// pool listener (HTTP/2, mTLS with node certificates) into their own, and
// each node serves its local components from its replica. The leader also
// passes on the Lease renewals of pool members that lost the cloud.
//
// The package knows nothing of the programs that use it: the edge gives
// it a Kubernetes client, its certificates and a view of the pool's
// members.
package poolstore
