package poolstore

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/poolstore/replica"
	"github.com/tether-edge/tether/tunnel"
)

// Paths served on the pool listener.
const (
	pathReplicate = "/pool/v1/replicate"
	pathLeader    = "/pool/v1/leader"
	pathHeartbeat = "/pool/v1/heartbeat"
)

// maxLeaseBytes bounds a delegated heartbeat's body.
const maxLeaseBytes = 64 << 10

// ServerOptions configure a Server. PeerConfig, Store and Leader are
// required.
type ServerOptions struct {
	PeerConfig
	// Store is this node's replica; it is streamed to followers while this
	// node leads.
	Store *replica.Store
	// Leader is the pool's leader as this node sees it ("" if unknown),
	// such as the elect.Elector's. This node serves replication and delegated
	// heartbeats only while it is Self; report Self only once the term's
	// Store.StartEpoch is done.
	Leader func() string
	// Delegate passes on a member's Lease renewal (the Lease's JSON, whose
	// name has been checked to be node's); nil refuses them (503).
	Delegate func(ctx context.Context, node string, lease []byte) error
	// DelegateTimeout bounds a Delegate call. Default 10 s.
	DelegateTimeout time.Duration
	// SyncEvery is how often a stream carries a sync frame at least (it
	// does at once when the leader's SyncedAt changes). Default 5 s.
	SyncEvery time.Duration
	// WriteTimeout ends a stream whose follower did not take a frame for
	// this long. Default 30 s.
	WriteTimeout time.Duration
	// Registerer, if set, gets the server's metrics.
	Registerer prometheus.Registerer
}

// Server is this node's side of the pool listener: it streams its store
// to followers while it leads, says whom it knows as leader, and takes
// members' Lease renewals to delegate. Every node runs one.
type Server struct {
	o   ServerOptions
	log *slog.Logger
	m   *serverMetrics
	mux *http.ServeMux
	tls *tls.Config
	// encoded is the JSON of recent changes, shared by the streams.
	encoded encodedChanges
}

// NewServer checks o and registers the metrics; Serve (or ServeHTTP
// behind TLSConfig) does the work.
func NewServer(o ServerOptions) (*Server, error) {
	cfg, err := o.PeerConfig.withDefaults()
	if err != nil {
		return nil, err
	}
	o.PeerConfig = cfg
	if o.Store == nil || o.Leader == nil {
		return nil, errors.New("pool server: Store and Leader are required")
	}
	o.DelegateTimeout = cmpOr(o.DelegateTimeout, 10*time.Second)
	o.SyncEvery = cmpOr(o.SyncEvery, 5*time.Second)
	o.WriteTimeout = cmpOr(o.WriteTimeout, 30*time.Second)
	s := &Server{o: o, log: o.Logger, mux: http.NewServeMux()}
	if s.m, err = newServerMetrics(o.Registerer); err != nil {
		return nil, fmt.Errorf("pool server metrics: %w", err)
	}
	s.tls = o.serverTLS(func(remote net.Addr, err error) { s.refused(remote.String(), "", err) })
	s.mux.HandleFunc("GET "+pathReplicate, s.serveReplicate)
	s.mux.HandleFunc("GET "+pathLeader, s.serveLeader)
	s.mux.HandleFunc("POST "+pathHeartbeat, s.serveHeartbeat)
	return s, nil
}

func cmpOr(v, def time.Duration) time.Duration {
	if v <= 0 {
		return def
	}
	return v
}

// TLSConfig is the listener's TLS configuration (HTTP/2 only; peers'
// certificates verified against the CAs); ServeHTTP expects connections
// made with it.
func (s *Server) TLSConfig() *tls.Config { return s.tls }

// Serve serves the pool listener on ln, adding TLS, until ctx ends; then
// it ends the streams and closes the connections.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	var protos http.Protocols
	protos.SetHTTP2(true)
	srv := &http.Server{
		Handler:           s,
		TLSConfig:         s.tls,
		Protocols:         &protos,
		HTTP2:             &http.HTTP2Config{SendPingTimeout: 15 * time.Second, PingTimeout: 10 * time.Second},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return ctx }, // ends the streams
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return fmt.Errorf("pool listener: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-errc
	return nil
}

// ServeHTTP admits peers of this node's pool only, then serves the pool
// API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, err := s.authorize(r); err != nil {
		s.refused(r.RemoteAddr, r.URL.Path, err)
		writeError(w, http.StatusForbidden, reasonForbidden, err.Error(), "")
		return
	}
	s.mux.ServeHTTP(w, r)
}

// authorize returns the peer's node name if it is a member of this
// node's pool. The handshake verified the certificate already; it is
// verified again so that the handler is safe behind any TLS listener.
func (s *Server) authorize(r *http.Request) (string, error) {
	if r.TLS == nil {
		return "", &refusal{refusedNoCertificate, errors.New("not a TLS connection")}
	}
	node, err := verifyNode(r.TLS.PeerCertificates, s.o.CAs(), s.o.Clock)
	if err != nil {
		return "", err
	}
	own, ok := s.o.Members.Pool(s.o.Self)
	if !ok {
		return "", &refusal{refusedNoPool, fmt.Errorf("node %s: this node's own pool is not known yet", node)}
	}
	pool, ok := s.o.Members.Pool(node)
	switch {
	case !ok:
		return "", &refusal{refusedUnknownNode, fmt.Errorf("node %s is not known to be in pool %s", node, own)}
	case pool != own:
		return "", &refusal{refusedOtherPool, fmt.Errorf("node %s is in pool %s, not %s", node, pool, own)}
	}
	return node, nil
}

// peerOf is the node name of an authorized request's peer.
func peerOf(r *http.Request) string {
	node, _ := tunnel.NodeName(r.TLS.PeerCertificates[0])
	return node
}

// refused counts and logs a refused peer.
func (s *Server) refused(remote, path string, err error) {
	reason := refusedBadCertificate
	if rf, ok := errors.AsType[*refusal](err); ok {
		reason = rf.reason
	}
	s.m.refused.WithLabelValues(reason).Inc()
	attrs := []any{"remote", remote, "reason", reason, "err", err}
	if path != "" {
		attrs = append(attrs, "path", path)
	}
	s.log.Warn("pool peer refused", attrs...)
}

// leading reports whether this node is the leader with a term started.
func (s *Server) leading() bool {
	return s.o.Leader() == s.o.Self && s.o.Store.Epoch() != ""
}

// notLeader answers 503 with the leader this node knows.
func (s *Server) notLeader(w http.ResponseWriter) {
	leader := s.o.Leader()
	msg := "not the leader"
	switch leader {
	case "":
		msg += "; no leader known"
	case s.o.Self:
		msg = "leader, but its term has not started"
		leader = ""
	default:
		msg += "; the leader is " + leader
	}
	writeError(w, http.StatusServiceUnavailable, reasonNotLeader, msg, leader)
}

// LeaderInfo is a node's answer to "who leads the pool?".
type LeaderInfo struct {
	// Node is the node that answered.
	Node string `json:"node"`
	// Leader is the leader it knows ("" if none).
	Leader string `json:"leader,omitempty"`
	// Epoch, Rev and SyncedAt are its replica's (on the leader: the
	// term's, and its watches' last sync).
	Epoch    string    `json:"epoch,omitempty"`
	Rev      uint64    `json:"rev"`
	SyncedAt time.Time `json:"syncedAt,omitzero"`
	// Mark is its replica's last signed mark (feed.Signed JSON): what a
	// node asking who leads ranks answers by, SyncedAt being only a claim.
	Mark json.RawMessage `json:"mark,omitempty"`
}

func (s *Server) serveLeader(w http.ResponseWriter, r *http.Request) {
	st := s.o.Store
	writeJSON(w, http.StatusOK, LeaderInfo{Node: s.o.Self, Leader: s.o.Leader(),
		Epoch: st.Epoch(), Rev: st.Rev(), SyncedAt: st.SyncedAt(), Mark: st.Mark()})
}

// serveHeartbeat takes a member's own node Lease and has Delegate pass
// it on.
func (s *Server) serveHeartbeat(w http.ResponseWriter, r *http.Request) {
	peer := peerOf(r)
	result, code, reason, msg := s.heartbeat(w, r, peer)
	s.m.heartbeats.WithLabelValues(result).Inc()
	if code == http.StatusOK {
		s.log.Debug("pool heartbeat delegated", "node", peer)
		writeJSON(w, code, apiStatus{Message: msg})
		return
	}
	if code == http.StatusServiceUnavailable && reason == reasonNotLeader {
		s.notLeader(w)
		return
	}
	s.log.Warn("pool heartbeat not delegated", "node", peer, "status", code, "err", msg)
	writeError(w, code, reason, msg, "")
}

// heartbeat does serveHeartbeat's work and says how to answer.
func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request, peer string) (result string, code int, reason, msg string) {
	if !s.leading() {
		return heartbeatNotLeader, http.StatusServiceUnavailable, reasonNotLeader, ""
	}
	if s.o.Delegate == nil {
		return heartbeatFailed, http.StatusServiceUnavailable, reasonUnavailable, "this leader does not delegate heartbeats"
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxLeaseBytes))
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return heartbeatBadRequest, http.StatusRequestEntityTooLarge, reasonBadRequest, fmt.Sprintf("a Lease is at most %d bytes", maxLeaseBytes)
	}
	if err != nil {
		return heartbeatBadRequest, http.StatusBadRequest, reasonBadRequest, "read body: " + err.Error()
	}
	var lease struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &lease); err != nil {
		return heartbeatBadRequest, http.StatusBadRequest, reasonBadRequest, "decode Lease: " + err.Error()
	}
	if lease.Kind != "" && lease.Kind != "Lease" {
		return heartbeatBadRequest, http.StatusBadRequest, reasonBadRequest, fmt.Sprintf("a %s is not a Lease", lease.Kind)
	}
	if m := lease.Metadata; m.Name != peer || (m.Namespace != "" && m.Namespace != corev1.NamespaceNodeLease) {
		return heartbeatRefused, http.StatusForbidden, reasonForbidden,
			fmt.Sprintf("node %s may delegate only its own Lease %s/%s, not %s/%s", peer, corev1.NamespaceNodeLease, peer, m.Namespace, m.Name)
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.o.DelegateTimeout)
	defer cancel()
	if err := s.o.Delegate(ctx, peer, body); err != nil {
		return heartbeatFailed, http.StatusServiceUnavailable, reasonUnavailable, "delegate heartbeat: " + err.Error()
	}
	return heartbeatAccepted, http.StatusOK, "", "delegated"
}

// Reasons in error answers (apiStatus.Reason).
const (
	reasonForbidden   = "Forbidden"
	reasonNotLeader   = "NotLeader"
	reasonBadRequest  = "BadRequest"
	reasonUnavailable = "Unavailable"
)

// apiStatus is the body of every answer but a stream or a LeaderInfo.
type apiStatus struct {
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message"`
	// Leader is set with NotLeader when the peer knows the leader.
	Leader string `json:"leader,omitempty"`
}

func writeError(w http.ResponseWriter, code int, reason, msg, leader string) {
	writeJSON(w, code, apiStatus{Reason: reason, Message: msg, Leader: leader})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v) // an error: the peer is gone
}
