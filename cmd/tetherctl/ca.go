package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"github.com/tether-edge/tether/gateway/selfca"
	"github.com/tether-edge/tether/internal/certfile"
)

// ca prints the CA bundle edges need as their --gateway-ca when the
// gateways manage their own certificates: each gateway's CA (GET /ca.crt
// on its admin endpoint), or with -data-dir the one in that directory,
// each CA once. It fails if any gateway did not give its CA, after printing
// the others'.
func ca(ctx context.Context, o options, stdout, stderr io.Writer) int {
	if o.dataDir != "" {
		path := filepath.Join(o.dataDir, selfca.CAFile)
		data, err := os.ReadFile(path)
		if err == nil {
			_, err = certfile.ParseCertificates(data)
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s ca: %s: %v\n", o.prog, path, err)
			return exitError
		}
		stdout.Write(data)
		return exitOK
	}

	bundles := make([][]*x509.Certificate, len(o.gateways))
	errs := make([]error, len(o.gateways))
	client := &http.Client{Timeout: o.timeout}
	var wg sync.WaitGroup
	for i, gw := range o.gateways {
		wg.Go(func() { bundles[i], errs[i] = fetchCA(ctx, client, normalizeGateway(gw)) })
	}
	wg.Wait()

	code := exitOK
	var seen [][]byte
	for i, err := range errs {
		if err != nil {
			fmt.Fprintln(stderr, "tetherctl:", err)
			code = exitError
			continue
		}
		for _, c := range bundles[i] {
			if !containsBytes(seen, c.Raw) {
				seen = append(seen, c.Raw)
				pem.Encode(stdout, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
			}
		}
	}
	return code
}

// fetchCA GETs gw's /ca.crt.
func fetchCA(ctx context.Context, client *http.Client, gw string) ([]*x509.Certificate, error) {
	body, err := get(ctx, client, gatewayAdmin, gw, "/ca.crt")
	if herr, ok := errors.AsType[*httpError](err); ok {
		// The gateway says why (a serving certificate from --tls-cert).
		why := herr.body
		if len(why) > 300 {
			why = why[:300] + "..."
		}
		return nil, fmt.Errorf("%w: %s", herr, why)
	} else if err != nil {
		return nil, err
	}
	certs, err := certfile.ParseCertificates(body)
	if err != nil {
		return nil, fmt.Errorf("gateway %s: /ca.crt: %w", gw, err)
	}
	return certs, nil
}

func containsBytes(list [][]byte, b []byte) bool {
	for _, x := range list {
		if bytes.Equal(x, b) {
			return true
		}
	}
	return false
}
