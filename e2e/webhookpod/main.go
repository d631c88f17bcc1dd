// Command webhookpod is a validating admission webhook for the end-to-end
// tests, run in a pod on an edge node: it denies every object whose name
// starts with "deny-" and allows the others, over TLS.
//
//	webhookpod --listen :8443 --cert tls.crt --key tls.key
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func main() {
	listen := flag.String("listen", ":8443", "TCP `address` to serve HTTPS on")
	cert := flag.String("cert", "tls.crt", "serving certificate `file` (PEM)")
	key := flag.String("key", "tls.key", "serving key `file` (PEM)")
	flag.Parse()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /validate", validate)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("serving on %s", *listen)
	log.Fatal(srv.ListenAndServeTLS(*cert, *key))
}

// validate answers an AdmissionReview: denied when the object's name
// starts with "deny-".
func validate(w http.ResponseWriter, r *http.Request) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("bad AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	req := review.Request
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if strings.HasPrefix(req.Name, "deny-") {
		resp.Allowed = false
		resp.Result = &metav1.Status{Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
			Message: fmt.Sprintf("edge webhook denies %s %s/%s", req.Kind.Kind, req.Namespace, req.Name)}
	}
	log.Printf("%s %s/%s: allowed=%v", req.Kind.Kind, req.Namespace, req.Name, resp.Allowed)
	review.Response, review.Request = resp, nil
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(review)
}
