package tunnel

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// MaxElectionRequestLen bounds an election request, fixed part included:
// the 16-bit length field bounds its body.
const MaxElectionRequestLen = requestFixed + 0xffff

// maxPoolLen is the longest pool name: a label value.
const maxPoolLen = validation.LabelValueMaxLength

// MaxConfigMapLen bounds the ConfigMap of an ElectionRequest, so that it
// fits beside any pool name, and the ConfigMap of an ElectionReply.
const MaxConfigMapLen = 0xffff - 3 - maxPoolLen

// MaxElectionReplyLen bounds an election reply: a Reply with the longest
// message, then the stored ConfigMap.
const MaxElectionReplyLen = replyFixed + maxFieldLength + 2 + MaxConfigMapLen

// MaxEdgeRequestLen bounds any request an edge sends (a DelegateRequest,
// an ElectionRequest, a probe or a PoolFeedRequest).
const MaxEdgeRequestLen = max(MaxDelegateRequestLen, MaxElectionRequestLen, MaxProbeRequestLen, MaxPoolFeedRequestLen, MaxServiceRequestLen)

// ElectionOp is what an ElectionRequest asks of the gateway.
type ElectionOp uint8

// Election operations.
const (
	ElectionCreate ElectionOp = 1 // create the record, which does not exist
	ElectionUpdate ElectionOp = 2 // update it from the version the request names
)

var electionOpNames = []string{ElectionCreate: "create", ElectionUpdate: "update"}

func (o ElectionOp) String() string { return enumName(electionOpNames, uint8(o), "op") }

// RecordKind says which of its pool's records an ElectionRequest writes.
type RecordKind uint8

// Record kinds: the ConfigMaps tether-system/pool-<pool> and
// tether-system/pool-<pool>-sync (package poolstore names them).
const (
	RecordElection RecordKind = 1 // the election record: who leads the pool
	RecordSync     RecordKind = 2 // the leader's sync record (leader-informer-sync)
)

var recordKindNames = []string{RecordElection: "election", RecordSync: "sync"}

func (k RecordKind) String() string { return enumName(recordKindNames, uint8(k), "record") }

// ElectionRequest is what the edge asks of the gateway on a stream it
// opens: create or update a record of the sender's pool, which a node
// identity may not write itself. The sender is the node of the
// connection's client certificate; the request never names it.
type ElectionRequest struct {
	Op     ElectionOp
	Record RecordKind
	// Pool is the sender's pool (its Node's pool label).
	Pool string
	// ConfigMap is the record as the edge would write it, as JSON
	// (core/v1 ConfigMap); an update carries the resourceVersion it is
	// based on. At most MaxConfigMapLen bytes.
	ConfigMap []byte
}

// AppendElectionRequest appends the wire form of r to b.
func AppendElectionRequest(b []byte, r ElectionRequest) ([]byte, error) {
	if err := checkElection(r); err != nil {
		return b, err
	}
	body := 3 + len(r.Pool) + len(r.ConfigMap)
	b = append(b, Version, kindElection)
	b = binary.BigEndian.AppendUint16(b, uint16(body))
	b = append(b, byte(r.Op), byte(r.Record), byte(len(r.Pool)))
	b = append(b, r.Pool...)
	return append(b, r.ConfigMap...), nil
}

// ReadElectionRequest reads one election request. It reads exactly the
// request's bytes and never more than MaxElectionRequestLen. A request of
// another kind is an ErrBadHeader.
func ReadElectionRequest(rd io.Reader) (ElectionRequest, error) {
	n, err := readFixed(rd, kindElection, MaxElectionRequestLen)
	if err != nil {
		return ElectionRequest{}, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		return ElectionRequest{}, fmt.Errorf("read request body: %w", err)
	}
	return parseElectionBody(body)
}

// parseElectionBody parses the body of an election request.
func parseElectionBody(body []byte) (ElectionRequest, error) {
	if len(body) < 3 || len(body) < 3+int(body[2]) {
		return ElectionRequest{}, fmt.Errorf("%w: truncated pool name", ErrBadHeader)
	}
	pl := int(body[2])
	r := ElectionRequest{Op: ElectionOp(body[0]), Record: RecordKind(body[1]),
		Pool: string(body[3 : 3+pl]), ConfigMap: body[3+pl:]}
	if err := checkElection(r); err != nil {
		return ElectionRequest{}, err
	}
	return r, nil
}

// checkElection checks what both sides of an ElectionRequest require.
func checkElection(r ElectionRequest) error {
	if r.Op != ElectionCreate && r.Op != ElectionUpdate {
		return fmt.Errorf("%w: election operation %d", ErrBadHeader, uint8(r.Op))
	}
	if r.Record != RecordElection && r.Record != RecordSync {
		return fmt.Errorf("%w: record kind %d", ErrBadHeader, uint8(r.Record))
	}
	if r.Pool == "" {
		return fmt.Errorf("%w: no pool", ErrBadHeader)
	}
	if errs := validation.IsValidLabelValue(r.Pool); len(errs) > 0 {
		return fmt.Errorf("%w: pool %q: %s", ErrBadHeader, r.Pool, strings.Join(errs, "; "))
	}
	switch n := len(r.ConfigMap); {
	case n == 0:
		return fmt.Errorf("%w: no ConfigMap", ErrBadHeader)
	case n > MaxConfigMapLen:
		return fmt.Errorf("%w: ConfigMap of %d bytes over the limit of %d", ErrBadHeader, n, MaxConfigMapLen)
	}
	return nil
}

// ElectionReply is the gateway's answer to an ElectionRequest: a Reply,
// and after an OK one the record as stored (so that the edge's next update
// names its resourceVersion).
type ElectionReply struct {
	Reply
	// ConfigMap is the stored record as JSON (OK only), at most
	// MaxConfigMapLen bytes.
	ConfigMap []byte
}

// WriteElectionReply writes r in one Write call. An OK reply must carry a
// ConfigMap of 1 to MaxConfigMapLen bytes; a refusal carries none.
func WriteElectionReply(w io.Writer, r ElectionReply) error {
	if r.Code == OK && (len(r.ConfigMap) == 0 || len(r.ConfigMap) > MaxConfigMapLen) {
		return fmt.Errorf("%w: stored ConfigMap of %d bytes, want 1 to %d", ErrBadHeader, len(r.ConfigMap), MaxConfigMapLen)
	}
	msg := r.Message
	if len(msg) > maxFieldLength {
		msg = msg[:maxFieldLength]
	}
	b := make([]byte, 0, replyFixed+len(msg)+2+len(r.ConfigMap))
	b = append(b, Version, byte(r.Code), byte(len(msg)))
	b = append(b, msg...)
	if r.Code == OK {
		b = binary.BigEndian.AppendUint16(b, uint16(len(r.ConfigMap)))
		b = append(b, r.ConfigMap...)
	}
	_, err := w.Write(b)
	return err
}

// ReadElectionReply reads one election reply, never more than
// MaxElectionReplyLen bytes. A refusal is returned together with a
// *RefusedError, as ReadReply does.
func ReadElectionReply(rd io.Reader) (ElectionReply, error) {
	rep, err := ReadReply(rd)
	if err != nil {
		return ElectionReply{Reply: rep}, err
	}
	var l [2]byte
	if _, err := io.ReadFull(rd, l[:]); err != nil {
		return ElectionReply{}, fmt.Errorf("read stored ConfigMap length: %w", err)
	}
	n := int(binary.BigEndian.Uint16(l[:]))
	if n == 0 || n > MaxConfigMapLen {
		return ElectionReply{}, fmt.Errorf("%w: stored ConfigMap of %d bytes, want 1 to %d", ErrBadHeader, n, MaxConfigMapLen)
	}
	cm := make([]byte, n)
	if _, err := io.ReadFull(rd, cm); err != nil {
		return ElectionReply{}, fmt.Errorf("read stored ConfigMap: %w", err)
	}
	return ElectionReply{Reply: rep, ConfigMap: cm}, nil
}

// EdgeRequest is a request read from a stream an edge opened: exactly one
// of its fields is set.
type EdgeRequest struct {
	Delegate *DelegateRequest
	Election *ElectionRequest
	PoolFeed *PoolFeedRequest
	Service  *ServiceRequest
	// Probe: a liveness probe (probe.go), answered with an OK Reply.
	Probe bool
}

// ReadEdgeRequest reads one request of a kind an edge may send: a
// DelegateRequest, an ElectionRequest, a PoolFeedRequest, a ServiceRequest
// or a probe. It reads exactly the
// request's bytes and never more than MaxEdgeRequestLen; a request of
// another kind (a connect Request) is an ErrBadHeader.
func ReadEdgeRequest(rd io.Reader) (EdgeRequest, error) {
	kind, n, err := readHead(rd)
	if err != nil {
		return EdgeRequest{}, err
	}
	limit := 0
	switch kind {
	case kindDelegate:
		limit = MaxDelegateRequestLen
	case kindElection:
		limit = MaxElectionRequestLen
	case kindProbe:
		limit = MaxProbeRequestLen
	case kindPoolFeed:
		limit = MaxPoolFeedRequestLen
	case kindService:
		limit = MaxServiceRequestLen
	default:
		return EdgeRequest{}, fmt.Errorf("%w: kind %d is no request of an edge", ErrBadHeader, kind)
	}
	if _, err := checkLength(n, limit); err != nil {
		return EdgeRequest{}, err
	}
	if kind == kindProbe {
		if err := readProbeBody(rd, n); err != nil {
			return EdgeRequest{}, err
		}
		return EdgeRequest{Probe: true}, nil
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		return EdgeRequest{}, fmt.Errorf("read request body: %w", err)
	}
	switch kind {
	case kindService:
		r, err := parseServiceBody(body)
		if err != nil {
			return EdgeRequest{}, err
		}
		return EdgeRequest{Service: &r}, nil
	case kindPoolFeed:
		r, err := parsePoolFeedBody(body)
		if err != nil {
			return EdgeRequest{}, err
		}
		return EdgeRequest{PoolFeed: &r}, nil
	case kindDelegate:
		r, err := parseDelegateBody(body)
		if err != nil {
			return EdgeRequest{}, err
		}
		return EdgeRequest{Delegate: &r}, nil
	}
	r, err := parseElectionBody(body)
	if err != nil {
		return EdgeRequest{}, err
	}
	return EdgeRequest{Election: &r}, nil
}
