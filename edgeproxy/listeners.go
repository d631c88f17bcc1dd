package edgeproxy

import (
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/accept"
)

// Names of tether-edge's TCP listeners, in logs and as the listener label
// of tether_edge_accept_errors_total.
const (
	listenerAPIServer = "apiserver" // the kube-apiserver proxy, --apiserver-listen
	listenerAdmin     = "admin"     // --admin-listen
	listenerPool      = "pool"      // the pool replica server, --pool-listen
	listenerService   = "service"   // the service listener, --service-listen
)

// listenTCP opens a listener; tests replace it to make Accept fail.
var listenTCP = func(name, addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

// listen opens the TCP listener of one of tether-edge's servers, wrapped
// so that a failed accept (EMFILE and the like) is retried after a
// backoff, logged once per streak and counted as
// tether_edge_accept_errors_total{listener=name}: the server then ends
// only when it is shut down, never tether-edge with it (package accept).
// The tunnel has no listener: the edge dials the gateways.
func listen(name, addr string, reg prometheus.Registerer, log *slog.Logger) (net.Listener, error) {
	errs, err := accept.Counter(reg, "tether_edge_accept_errors_total", name)
	if err != nil {
		return nil, err
	}
	ln, err := listenTCP(name, addr)
	if err != nil {
		return nil, err
	}
	return accept.Listen(ln, accept.Options{Name: name, Logger: log, Errors: errs}), nil
}
