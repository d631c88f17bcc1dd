package nodewatch

// Snapshot is the set of Nodes at one point in time, with the gateway's
// routing decision for them. It is immutable once published: consumers
// may keep it and read it from any goroutine.
type Snapshot struct {
	// Nodes holds every Node in the cluster, edge or not, by name.
	Nodes map[string]Node
	// Routes says which edge node each address reaches (Resolve). Every
	// consumer routes, redirects and answers exactly these addresses.
	// Set in every snapshot the watcher publishes; read it through
	// Routing.
	Routes *Routes
	// Pods says which edge node each pod range reaches (ResolvePods);
	// nil routes none. Set in every snapshot the watcher publishes.
	Pods *PodRoutes
	// Version increases with every published change; the empty snapshot
	// returned before the first sync has Version 0.
	Version uint64
}

// Routing returns the routes of the snapshot in mode. A snapshot the
// watcher published carries them, resolved with its history and the
// gateway host's addresses; a snapshot built by hand (tests, benchmarks)
// has none and is resolved here, without either. Routes of another mode
// than the one asked for route nothing: a consumer configured with another
// mode than the watcher's fails closed.
func (s *Snapshot) Routing(mode Mode) *Routes {
	switch {
	case s.Routes == nil:
		return Resolve(s.Nodes, Policy{Mode: mode}, nil, nil)
	case s.Routes.Mode() != mode:
		return &Routes{mode: mode}
	}
	return s.Routes
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
