package edgeproxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"

	edgetunnel "github.com/tether-edge/tether/edgeproxy/tunnel"
)

// Config is tether-edge's configuration. The JSON names are the flag
// names and the keys of the YAML file (/etc/tether/edge.yaml).
type Config struct {
	// NodeName is this node's name; by default the one in the client
	// certificate (CN=system:node:<name>). The gateway always goes by the
	// certificate.
	NodeName string `json:"node-name,omitempty"`
	// Kubeconfig and ServerAddr reach the cloud kube-apiserver, for the
	// apiserver proxy (not in this build yet).
	Kubeconfig string   `json:"kubeconfig,omitempty"`
	ServerAddr []string `json:"server-addr,omitempty"`
	// Cert and Key are the node's client certificate and key, PEM; they
	// may be one file (the kubelet's kubelet-client-current.pem).
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	// Gateway lists the gateway replicas: host:port entries and/or DNS
	// names that resolve to every replica (port 10262 if none is given).
	Gateway []string `json:"gateway,omitempty"`
	// GatewayCA verifies the gateways' certificates (PEM); empty means
	// the system's roots.
	GatewayCA string `json:"gateway-ca,omitempty"`
	// GatewayServerName is the name the gateways' certificates must hold;
	// by default the host part of each --gateway entry.
	GatewayServerName string `json:"gateway-server-name,omitempty"`
	// AllowPorts are the ports of this node that cloud clients may reach
	// through the tunnel.
	AllowPorts Ports `json:"allow-ports,omitempty"`
	// MaxStreams bounds the connections relayed at once.
	MaxStreams int `json:"max-streams,omitempty"`

	APIServerListen string `json:"apiserver-listen,omitempty"`
	AdminListen     string `json:"admin-listen,omitempty"`
	Pool            string `json:"pool,omitempty"`
	PoolListen      string `json:"pool-listen,omitempty"`
	DataDir         string `json:"data-dir,omitempty"`

	LogLevel  string `json:"log-level,omitempty"`
	LogFormat string `json:"log-format,omitempty"`

	// Logger is where Run logs; nil means slog.Default().
	Logger *slog.Logger `json:"-"`
}

// Defaults of the settings that have one (DESIGN.md, Ports and names).
const (
	DefaultAPIServerListen = "127.0.0.1:10261"
	DefaultAdminListen     = "127.0.0.1:10267"
	DefaultPoolListen      = ":10269"
	DefaultDataDir         = "/var/lib/tether"
	DefaultMaxStreams      = 1024
)

// DefaultConfig is the configuration before the file and the flags.
func DefaultConfig() Config {
	return Config{
		AllowPorts:      Ports{10250, 10255},
		MaxStreams:      DefaultMaxStreams,
		APIServerListen: DefaultAPIServerListen,
		AdminListen:     DefaultAdminListen,
		PoolListen:      DefaultPoolListen,
		DataDir:         DefaultDataDir,
		LogLevel:        "info",
		LogFormat:       "text",
	}
}

// Validate says what is missing or wrong, in terms of the flags.
func (c Config) Validate() error {
	var errs []error
	if len(c.Gateway) == 0 {
		if c.Kubeconfig != "" || len(c.ServerAddr) > 0 {
			errs = append(errs, errors.New("nothing to do: without --gateway tether-edge would run only its kube-apiserver proxy (--kubeconfig, --server-addr), which this build does not have yet; give --gateway"))
		} else {
			errs = append(errs, errors.New("nothing to do: give --gateway (the tether-gateway replicas to keep the tunnel to); the kube-apiserver proxy that runs without it is not in this build yet"))
		}
	} else {
		if _, err := edgetunnel.ParseTargets(c.Gateway); err != nil {
			errs = append(errs, fmt.Errorf("--gateway: %w", err))
		}
		if c.Cert == "" || c.Key == "" {
			errs = append(errs, errors.New("--gateway needs the node's client certificate: give --cert and --key (the kubelet's /var/lib/kubelet/pki/kubelet-client-current.pem holds both; give it to both)"))
		}
	}
	if len(c.AllowPorts) == 0 {
		errs = append(errs, errors.New("--allow-ports is empty: the tunnel could reach nothing"))
	}
	if c.MaxStreams < 0 {
		errs = append(errs, errors.New("--max-streams must not be negative"))
	}
	if c.AdminListen != "" {
		if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
			errs = append(errs, fmt.Errorf("--admin-listen: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Ports is a list of TCP ports. As a flag it takes a comma-separated
// list that replaces the default; in the YAML file, a list of numbers (or
// the same comma-separated string).
type Ports []uint16

func (p *Ports) String() string {
	if p == nil {
		return ""
	}
	s := make([]string, len(*p))
	for i, port := range *p {
		s[i] = strconv.Itoa(int(port))
	}
	return strings.Join(s, ",")
}

func (p *Ports) Set(v string) error {
	var out Ports
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("bad port %q", f)
		}
		out = append(out, uint16(n))
	}
	*p = out
	return nil
}

func (p *Ports) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		return p.Set(s)
	}
	var list []uint16
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("want a list of ports: %w", err)
	}
	for _, n := range list {
		if n == 0 {
			return errors.New("bad port 0")
		}
	}
	*p = list
	return nil
}
