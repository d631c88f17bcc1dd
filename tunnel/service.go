package tunnel

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// MaxServiceRequestLen bounds a service request, fixed part included: the
// namespace and name (DNS-1123 labels of at most 63 bytes, each with its
// length), the port, and up to 255 bytes a later version may add (a
// reader skips them).
const MaxServiceRequestLen = requestFixed + 2*(1+validation.DNS1123LabelMaxLength) + 2 + maxFieldLength

// ServiceRequest is what the edge asks of the gateway on a stream it
// opens for a pod of its node: a connection to a cloud Service that the
// operator marked for edge access. It names the Service, never an
// address: the gateway picks one of the Service's ready cloud endpoints.
// The gateway answers with a Reply (OK once connected, or NotMarked,
// NoEndpoints, DialFailed, Overloaded, RateLimited, BadRequest); after OK
// the stream carries the connection's bytes both ways (Relay) until
// either side ends it. The sender is the node of the connection's client
// certificate; the request never names it.
type ServiceRequest struct {
	// Namespace and Name name the Service.
	Namespace, Name string
	// Port is the Service's port (spec.ports[].port), TCP.
	Port uint16
}

// Codes of the gateway's reply to a ServiceRequest, besides OK,
// DialFailed, Overloaded, RateLimited and BadRequest.
const (
	NotMarked   Code = 17 // no such Service, or it or its port is not marked for edge access
	NoEndpoints Code = 18 // the Service has no ready endpoint the gateway may dial
)

// ServiceCodes lists the codes of a reply to a ServiceRequest, for
// pre-creating metric series.
func ServiceCodes() []Code {
	return []Code{OK, BadRequest, NotMarked, NoEndpoints, DialFailed, Overloaded, RateLimited}
}

// String names the Service and port as "namespace/name:port".
func (r ServiceRequest) String() string { return fmt.Sprintf("%s/%s:%d", r.Namespace, r.Name, r.Port) }

// AppendServiceRequest appends the wire form of r to b.
func AppendServiceRequest(b []byte, r ServiceRequest) ([]byte, error) {
	if err := checkService(r); err != nil {
		return b, err
	}
	b = append(b, Version, kindService)
	b = binary.BigEndian.AppendUint16(b, uint16(1+len(r.Namespace)+1+len(r.Name)+2))
	b = append(b, byte(len(r.Namespace)))
	b = append(b, r.Namespace...)
	b = append(b, byte(len(r.Name)))
	b = append(b, r.Name...)
	return binary.BigEndian.AppendUint16(b, r.Port), nil
}

// WriteServiceRequest writes r in one Write call.
func WriteServiceRequest(w io.Writer, r ServiceRequest) error {
	b, err := AppendServiceRequest(nil, r)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// parseServiceBody parses the body of a service request; bytes after the
// port are skipped.
func parseServiceBody(body []byte) (ServiceRequest, error) {
	var r ServiceRequest
	for _, f := range []*string{&r.Namespace, &r.Name} {
		if len(body) < 1 || len(body) < 1+int(body[0]) {
			return ServiceRequest{}, fmt.Errorf("%w: truncated service request", ErrBadHeader)
		}
		*f, body = string(body[1:1+int(body[0])]), body[1+int(body[0]):]
	}
	if len(body) < 2 {
		return ServiceRequest{}, fmt.Errorf("%w: truncated service port", ErrBadHeader)
	}
	r.Port = binary.BigEndian.Uint16(body)
	if err := checkService(r); err != nil {
		return ServiceRequest{}, err
	}
	return r, nil
}

// checkService checks what both sides of a ServiceRequest require.
func checkService(r ServiceRequest) error {
	for _, f := range []struct{ what, v string }{{"namespace", r.Namespace}, {"name", r.Name}} {
		if errs := validation.IsDNS1123Label(f.v); len(errs) > 0 {
			return fmt.Errorf("%w: service %s %q: %s", ErrBadHeader, f.what, f.v, strings.Join(errs, "; "))
		}
	}
	if r.Port == 0 {
		return fmt.Errorf("%w: service port 0", ErrBadHeader)
	}
	return nil
}
