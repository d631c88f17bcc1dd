package world

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tether-edge/tether/internal/testenv"
)

// Kubelet is a stand-in for a kubelet's HTTPS server on :10250, with its
// own serving certificate (SANs: the node's address and name), so a client
// that verifies it proves TLS ran end to end. It serves:
//
//	/healthz           "ok <node>"
//	/bytes?n=N         N bytes of a fixed pattern (bulk transfers)
//	/echo              the request body back
//	/containerLogs/<namespace>/<pod>/<container>
//	                   a few log lines naming them and the node (what
//	                   kube-apiserver asks for `kubectl logs`)
type Kubelet struct {
	Node string
	Addr string // host:port as seen inside the site
	// Requests counts the requests it has served.
	Requests atomic.Int64
	srv      *http.Server
}

// StartKubelet serves the stand-in kubelet inside h until t's cleanup.
func StartKubelet(t testenv.T, h *testenv.Host, node string, ca *testenv.CA) *Kubelet {
	t.Helper()
	kp, err := ca.ServerCert(node, h.Addr.String(), node, node+"."+Zone)
	if err != nil {
		t.Fatalf("%v", err)
	}
	ln, err := h.Listen("tcp", fmt.Sprintf(":%d", KubeletPort))
	if err != nil {
		t.Fatalf("stand-in kubelet on %s: %v", node, err)
	}
	k := &Kubelet{Node: node, Addr: net.JoinHostPort(h.Addr.String(), strconv.Itoa(KubeletPort))}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "ok %s\n", node)
	})
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "n must be a byte count", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		io.CopyN(w, Pattern{}, n)
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, r.Body)
	})
	mux.HandleFunc("/containerLogs/{namespace}/{pod}/{container}", func(w http.ResponseWriter, r *http.Request) {
		for i := 1; i <= 3; i++ {
			fmt.Fprintf(w, "%s/%s container %s, line %d: served by the kubelet of %s\n",
				r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container"), i, node)
		}
	})
	k.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k.Requests.Add(1)
			mux.ServeHTTP(w, r)
		}),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{kp.TLS}},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          nil,
	}
	go k.srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { k.srv.Close() })
	return k
}

// Pattern is an endless reader of a fixed byte pattern, so both ends of a
// bulk transfer can compute the expected hash without storing the data.
type Pattern struct{}

func (Pattern) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(i*7 + 3)
	}
	return len(p), nil
}
