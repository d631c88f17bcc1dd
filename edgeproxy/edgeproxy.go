// Package edgeproxy is tether-edge: it keeps the QUIC tunnel from this
// edge node to the gateway replicas (package edgetunnel) and serves the
// admin endpoints. The kube-apiserver proxy and the node pool will join
// it here.
package edgeproxy

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"

	"golang.org/x/sync/errgroup"

	edgetunnel "github.com/tether-edge/tether/edgeproxy/tunnel"
	"github.com/tether-edge/tether/internal/admin"
	"github.com/tether-edge/tether/internal/version"
)

// Run runs tether-edge until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if b, err := json.Marshal(cfg); err == nil {
		log.Debug("effective configuration", "config", string(b))
	}
	if cfg.Kubeconfig != "" || len(cfg.ServerAddr) > 0 || cfg.Pool != "" {
		log.Warn("--kubeconfig, --server-addr and --pool are not used yet: this build has the tunnel only")
	}

	certs, err := edgetunnel.LoadCertFiles(cfg.Cert, cfg.Key, log)
	if err != nil {
		return err
	}
	certNode, err := certs.NodeName()
	if err != nil {
		return fmt.Errorf("--cert %s cannot register with a gateway: %w", cfg.Cert, err)
	}
	node := certNode
	if cfg.NodeName != "" && cfg.NodeName != certNode {
		log.Warn("--node-name differs from the node the client certificate names; the gateway knows this edge by its certificate",
			"node_name", cfg.NodeName, "cert_node", certNode)
		node = cfg.NodeName
	}
	log = log.With("node", node)

	var roots *x509.CertPool
	if cfg.GatewayCA != "" {
		if roots, err = loadCAs(cfg.GatewayCA); err != nil {
			return err
		}
	}

	reg := admin.NewRegistry()
	tun, err := edgetunnel.New(edgetunnel.Options{
		Gateways:    cfg.Gateway,
		ServerName:  cfg.GatewayServerName,
		RootCAs:     roots,
		Certificate: certs.GetClientCertificate,
		AllowPorts:  cfg.AllowPorts,
		MaxStreams:  cfg.MaxStreams,
		Logger:      log,
		Registry:    reg,
	})
	if err != nil {
		return err
	}

	var adminLn net.Listener
	if cfg.AdminListen != "" {
		if adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
			return fmt.Errorf("admin listener: %w", err)
		}
	}

	log.Info("tether-edge starting", "version", version.Version, "gateway", cfg.Gateway,
		"allow_ports", cfg.AllowPorts.String(), "admin", cfg.AdminListen)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return tun.Run(ctx) })
	if adminLn != nil {
		h := admin.New(admin.Options{
			Registry: reg,
			Ready:    tun.Ready,
			Status:   func() any { return Status{Node: node, Version: version.Version, Gateways: tun.Status()} },
			Logger:   log,
		})
		g.Go(func() error { return admin.ServeListener(ctx, adminLn, h) })
	}
	err = g.Wait()
	log.Info("tether-edge stopped")
	return err
}

// Status is what /status serves.
type Status struct {
	Node     string                     `json:"node"`
	Version  string                     `json:"version"`
	Gateways []edgetunnel.GatewayStatus `json:"gateways"`
}

func loadCAs(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--gateway-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--gateway-ca %s: no PEM certificate in it", path)
	}
	return pool, nil
}
