package tunnel

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// MaxDelegateRequestLen bounds a delegate-heartbeat request, fixed part
// included: the 16-bit length field bounds its body.
const MaxDelegateRequestLen = requestFixed + 0xffff

// MaxLeaseLen bounds the Lease of a DelegateRequest, so that it fits
// beside any node name.
const MaxLeaseLen = 0xffff - 1 - maxFieldLength

// MaxStreamsToGateway is how many streams an edge may have open toward
// one gateway replica at once (the gateway's MaxIncomingStreams); more
// wait in OpenStreamSync for one to end.
const MaxStreamsToGateway = 16

// DelegateRequest is what the edge asks of the gateway on a stream it
// opens: write Lease as the heartbeat of Node, a node of the sender's pool
// that lost the cloud. The sender is the node of the connection's client
// certificate; the request never names it.
type DelegateRequest struct {
	// Node is the delegated node.
	Node string
	// Lease is the node's coordination.k8s.io/v1 Lease as JSON, as its
	// kubelet wrote it; at most MaxLeaseLen bytes.
	Lease []byte
}

// AppendDelegateRequest appends the wire form of r to b.
func AppendDelegateRequest(b []byte, r DelegateRequest) ([]byte, error) {
	if err := checkDelegate(r.Node, len(r.Lease)); err != nil {
		return b, err
	}
	body := 1 + len(r.Node) + len(r.Lease)
	b = append(b, Version, kindDelegate)
	b = binary.BigEndian.AppendUint16(b, uint16(body))
	b = append(b, byte(len(r.Node)))
	b = append(b, r.Node...)
	return append(b, r.Lease...), nil
}

// WriteDelegateRequest writes r in one Write call.
func WriteDelegateRequest(w io.Writer, r DelegateRequest) error {
	b, err := AppendDelegateRequest(make([]byte, 0, requestFixed+1+len(r.Node)+len(r.Lease)), r)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// ReadDelegateRequest reads one delegate-heartbeat request. It reads
// exactly the request's bytes and never more than MaxDelegateRequestLen.
// A connect Request (another kind) is an ErrBadHeader.
func ReadDelegateRequest(rd io.Reader) (DelegateRequest, error) {
	n, err := readFixed(rd, kindDelegate, MaxDelegateRequestLen)
	if err != nil {
		return DelegateRequest{}, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		return DelegateRequest{}, fmt.Errorf("read request body: %w", err)
	}
	return parseDelegateBody(body)
}

// parseDelegateBody parses the body of a delegate request.
func parseDelegateBody(body []byte) (DelegateRequest, error) {
	if len(body) < 1 || len(body) < 1+int(body[0]) {
		return DelegateRequest{}, fmt.Errorf("%w: truncated node name", ErrBadHeader)
	}
	nl := int(body[0])
	r := DelegateRequest{Node: string(body[1 : 1+nl]), Lease: body[1+nl:]}
	if err := checkDelegate(r.Node, len(r.Lease)); err != nil {
		return DelegateRequest{}, err
	}
	return r, nil
}

// checkDelegate checks what both sides of a DelegateRequest require.
func checkDelegate(node string, leaseLen int) error {
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return fmt.Errorf("%w: node name %q: %s", ErrBadHeader, node, strings.Join(errs, "; "))
	}
	switch {
	case leaseLen == 0:
		return fmt.Errorf("%w: no Lease", ErrBadHeader)
	case leaseLen > MaxLeaseLen:
		return fmt.Errorf("%w: Lease of %d bytes over the limit of %d", ErrBadHeader, leaseLen, MaxLeaseLen)
	}
	return nil
}
