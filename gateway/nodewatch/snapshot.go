package nodewatch

// Snapshot is the set of Nodes at one point in time. It is immutable once
// published: consumers may keep it and read it from any goroutine.
type Snapshot struct {
	// Nodes holds every Node in the cluster, edge or not, by name.
	Nodes map[string]Node
	// Version increases with every published change; the empty snapshot
	// returned before the first sync has Version 0.
	Version uint64
}

// Lookup returns the node with the given name.
func (s *Snapshot) Lookup(name string) (Node, bool) {
	n, ok := s.Nodes[name]
	return n, ok
}

// Edge returns the number of edge nodes in the snapshot.
func (s *Snapshot) Edge() int {
	c := 0
	for _, n := range s.Nodes {
		if n.Edge {
			c++
		}
	}
	return c
}
