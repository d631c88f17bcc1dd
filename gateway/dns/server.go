// Package dns is the gateway's authoritative DNS server for node names.
//
// It answers A and AAAA queries for every edge node — by its bare name
// (edge-1.) and under each configured zone (edge-1.tether.internal.) — with
// the address that reaches the node through the gateway in the active
// address mode, PTR queries for VIPs, and SOA/NS at each zone apex. It
// never recurses. See README.md for the answer rules and how to point
// CoreDNS, kube-apiserver and metrics-server at it.
//
// Data flow: nodewatch publishes a Snapshot; Update renders it into an
// immutable table of prebuilt records and swaps it in atomically. The
// query path loads the table with one atomic read and takes no lock, so a
// node added, changed or deleted is reflected in the very next answer.
package dns

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/gateway/nodewatch"
)

// Defaults for Options.
const (
	DefaultTTL        = 5 * time.Second
	DefaultMaxUDPSize = 1232 // the DNS flag day 2020 size: no IP fragmentation
	// DefaultMaxAmplification bounds a UDP answer to this many times the
	// size of its query (QUIC's anti-amplification limit is 3).
	DefaultMaxAmplification = 4
)

// Options configure a Server.
type Options struct {
	// Zones the server is authoritative for, such as "tether.internal."
	// (the trailing dot is optional; case does not matter). Node names are
	// answered bare and under each zone; PTR targets use the first zone.
	Zones []string
	// TTL of every answer and of negative answers (SOA minimum); 0 means
	// DefaultTTL.
	TTL time.Duration
	// Mode selects the address answered for edge nodes; "" means node-ip.
	Mode nodewatch.Mode
	// CloudNodes also answers the names of cloud (non-edge) nodes, with
	// their own InternalIPs.
	CloudNodes bool
	// NSAddrs are the gateway's own addresses, answered for the zones' name
	// server ns.dns.<zone>; optional.
	NSAddrs []netip.Addr
	// MaxUDPSize caps UDP answers below the size the client offers with
	// EDNS0; 0 means DefaultMaxUDPSize.
	MaxUDPSize int
	// MaxAmplification caps a UDP answer at this many times the size of
	// its query, so that a forged source address cannot turn the server
	// into a reflector; an answer past it is sent truncated (TC=1, the
	// size of the query or less) and the client asks again over TCP. 0
	// means DefaultMaxAmplification.
	MaxAmplification int
	// Logger receives the server's logs; nil discards them. Refused
	// queries are logged at info level, at most once per source address
	// per RefusalLogInterval, with the count of the others.
	Logger *slog.Logger
	// RefusalLogInterval is how often, at most, a refused query from one
	// source address is logged; 0 means DefaultRefusalLogInterval.
	RefusalLogInterval time.Duration
	// Clock times the refusal log; nil means the real clock.
	Clock clock.PassiveClock
	// MaxTCPConns caps the TCP connections open at once, and
	// MaxTCPConnsPerSource those from one client address; a connection
	// past either is reset at once, counted and logged like a refused
	// query. 0 means DefaultMaxTCPConns, DefaultMaxTCPConnsPerSource.
	MaxTCPConns          int
	MaxTCPConnsPerSource int
	// TCPIdleTimeout closes a TCP connection that has not sent a whole
	// query this long after it connected or got its last answer; 0 means
	// DefaultTCPIdleTimeout.
	TCPIdleTimeout time.Duration
	// Registerer, if set, gets the server's metrics: queries by rcode, TCP
	// connections open and refused, failed accepts and reads.
	Registerer prometheus.Registerer
}

// Validate checks the options before use.
func (o Options) Validate() error {
	var errs []error
	for _, z := range o.Zones {
		if z == "" || z == "." {
			errs = append(errs, fmt.Errorf("zone %q: the root zone cannot be served", z))
		} else if _, ok := dns.IsDomainName(z); !ok {
			errs = append(errs, fmt.Errorf("zone %q is not a domain name", z))
		}
	}
	if o.Mode != "" {
		if _, err := nodewatch.ParseMode(string(o.Mode)); err != nil {
			errs = append(errs, err)
		}
	}
	if o.TTL < 0 || o.TTL > 24*time.Hour {
		errs = append(errs, fmt.Errorf("TTL %s out of range (0 to 24h)", o.TTL))
	}
	if o.RefusalLogInterval < 0 {
		errs = append(errs, fmt.Errorf("refusal log interval %s is negative", o.RefusalLogInterval))
	}
	if o.MaxTCPConns < 0 || o.MaxTCPConnsPerSource < 0 || o.TCPIdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("TCP limits (%d connections, %d per source, %s idle) must not be negative",
			o.MaxTCPConns, o.MaxTCPConnsPerSource, o.TCPIdleTimeout))
	}
	if o.MaxAmplification < 0 {
		errs = append(errs, fmt.Errorf("max amplification %d is negative", o.MaxAmplification))
	}
	if o.MaxUDPSize != 0 && (o.MaxUDPSize < 512 || o.MaxUDPSize > 65535) {
		errs = append(errs, fmt.Errorf("max UDP size %d out of range (512 to 65535)", o.MaxUDPSize))
	}
	return errors.Join(errs...)
}

// Server answers node-name queries. Its methods are safe for concurrent use.
type Server struct {
	opts         Options
	log          *slog.Logger
	table        atomic.Pointer[table]
	metrics      *metrics
	refusals     *refusalLog // refused queries
	connRefusals *refusalLog // refused TCP connections
	tcp          *tcpConns
}

var _ dns.Handler = (*Server)(nil)

// New returns a Server with an empty table (every node name is unknown
// until the first Update). Options should have passed Validate; New fails
// only when the metrics cannot be registered.
func New(opts Options) (*Server, error) {
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.Mode == "" {
		opts.Mode = nodewatch.ModeNodeIP
	}
	if opts.MaxUDPSize == 0 {
		opts.MaxUDPSize = DefaultMaxUDPSize
	}
	if opts.MaxAmplification == 0 {
		opts.MaxAmplification = DefaultMaxAmplification
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.RefusalLogInterval == 0 {
		opts.RefusalLogInterval = DefaultRefusalLogInterval
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.MaxTCPConns == 0 {
		opts.MaxTCPConns = DefaultMaxTCPConns
	}
	if opts.MaxTCPConnsPerSource == 0 {
		opts.MaxTCPConnsPerSource = DefaultMaxTCPConnsPerSource
	}
	if opts.TCPIdleTimeout == 0 {
		opts.TCPIdleTimeout = DefaultTCPIdleTimeout
	}
	zones := make([]string, 0, len(opts.Zones))
	for _, z := range opts.Zones {
		z = strings.ToLower(dns.Fqdn(z))
		if !slices.Contains(zones, z) {
			zones = append(zones, z)
		}
	}
	opts.Zones = zones
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("register dns metrics: %w", err)
	}
	s := &Server{opts: opts, log: opts.Logger, metrics: m,
		refusals:     newRefusalLog(opts.Logger, opts.Clock, opts.RefusalLogInterval),
		connRefusals: newConnRefusalLog(opts.Logger, opts.Clock, opts.RefusalLogInterval),
		tcp:          newTCPConns(opts.MaxTCPConns, opts.MaxTCPConnsPerSource)}
	s.Update(&nodewatch.Snapshot{})
	return s, nil
}

// Update renders snap into a new table and swaps it in; the next query is
// answered from it. It is meant as a nodewatch subscriber.
func (s *Server) Update(snap *nodewatch.Snapshot) {
	t := buildTable(snap, &s.opts)
	s.table.Store(t)
	s.log.Debug("dns table updated", "version", snap.Version, "names", len(t.names))
}
