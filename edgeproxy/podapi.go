package edgeproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/edgeproxy/apiproxy"
	"github.com/tether-edge/tether/edgeproxy/apiproxy/podcache"
	"github.com/tether-edge/tether/edgeproxy/upstream"
	"github.com/tether-edge/tether/internal/certfile"
	"github.com/tether-edge/tether/internal/component"
)

// listenerPodAPI names the pod listener, --pod-api-listen.
const listenerPodAPI = "pod-api"

// podAPI is the pod listener (--pod-api-listen): pods of this node reach
// kube-apiserver through it with their own tokens (apiproxy, podapi.go).
type podAPI struct {
	ln    net.Listener // TLS
	cache *podcache.Cache
}

// newPodAPI opens the pod listener and its cache; nil when
// --pod-api-listen is empty.
func newPodAPI(cfg Config, ups *upstream.Upstreams, reg prometheus.Registerer, log *slog.Logger) (*podAPI, *apiproxy.PodOptions, error) {
	if cfg.PodAPIListen == "" {
		return nil, nil, nil
	}
	kp, err := certfile.LoadKeyPair(cfg.PodAPICert, cfg.PodAPIKey, certfile.Options{Name: "--pod-api-cert", Logger: log})
	if err != nil {
		return nil, nil, fmt.Errorf("--pod-api-cert: %w", err)
	}
	addrs := cfg.PodAPIAddress
	if len(addrs) == 0 {
		if addrs, err = certAddresses(kp); err != nil {
			return nil, nil, err
		}
	}
	_, port, _ := net.SplitHostPort(cfg.PodAPIListen)
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return nil, nil, fmt.Errorf("--pod-api-listen %q: want a port number", cfg.PodAPIListen)
	}
	c, err := podcache.Open(filepath.Join(cfg.DataDir, podcache.FileName), podcache.Options{Logger: log})
	if err != nil {
		return nil, nil, err
	}
	ln, err := listen(listenerPodAPI, cfg.PodAPIListen, reg, log)
	if err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("pod API listener: %w", err)
	}
	ln = tls.NewListener(ln, &tls.Config{GetCertificate: kp.GetCertificate, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12})
	log.Info("pod API listener", "listen", ln.Addr().String(), "kubernetes_service_for_kubelet", addrs, "cache", c.Path())
	return &podAPI{ln: ln, cache: c},
		&apiproxy.PodOptions{Transport: ups.PodTransport(), Cache: c, Addresses: addrs, Port: int32(p)}, nil
}

// certAddresses are the serving certificate's IP addresses, the first of
// each family: where the kubelet tells pods the API is.
func certAddresses(kp *certfile.KeyPair) ([]string, error) {
	cert, err := kp.Certificate()
	if err != nil {
		return nil, err
	}
	if cert.Leaf == nil || len(cert.Leaf.IPAddresses) == 0 {
		return nil, errors.New("--pod-api-cert holds no IP address: give --pod-api-address (pods dial an address and check it against the certificate)")
	}
	var v4, v6 string
	for _, ip := range cert.Leaf.IPAddresses {
		switch {
		case ip.To4() != nil && v4 == "":
			v4 = ip.String()
		case ip.To4() == nil && v6 == "":
			v6 = ip.String()
		}
	}
	var out []string
	for _, a := range []string{v4, v6} {
		if a != "" {
			out = append(out, a)
		}
	}
	return out, nil
}

func (pa *podAPI) close() error { return errors.Join(pa.ln.Close(), pa.cache.Close()) }

// part serves the pod listener.
func (pa *podAPI) part(px *apiproxy.Proxy) component.Component {
	return part{N: "pod-api", RunF: func(ctx context.Context) error { return px.ServePods(ctx, pa.ln) }, CloseF: pa.close}
}
