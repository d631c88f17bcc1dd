package tunnel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
)

// Version is the stream header version this package writes and reads.
const Version = 1

// MaxRequestLen bounds a request header, fixed part included.
const MaxRequestLen = 512

// Request kinds (the second byte of a request).
const (
	kindConnect  = 1 // the gateway asks the edge to dial (Request)
	kindDelegate = 2 // the edge asks the gateway to write a Lease (DelegateRequest)
	kindElection = 3 // the edge asks the gateway to write its pool's record (ElectionRequest)
	kindProbe    = 4 // the edge asks whether the gateway still knows the connection (probe.go)
	kindPoolFeed = 5 // the edge, its pool's leader, asks for the pool's signed feed (PoolFeedRequest)
	kindService  = 6 // the edge asks the gateway to connect a pod to a marked cloud Service (ServiceRequest)
)

const (
	fieldClient    = 1
	requestFixed   = 4 // version, kind, length
	replyFixed     = 3 // version, code, length
	maxFieldLength = 255
)

// Request is what the gateway asks of the edge on a new stream.
type Request struct {
	// Dest is the TCP address the edge should dial.
	Dest netip.AddrPort
	// Client is the address of the cloud client, for the edge's logs only;
	// the edge never trusts it for anything.
	Client string
}

// ErrBadHeader is wrapped by every error about malformed header bytes.
var ErrBadHeader = errors.New("bad stream header")

// AppendRequest appends the wire form of r to b.
func AppendRequest(b []byte, r Request) ([]byte, error) {
	addr := r.Dest.Addr().Unmap()
	if !addr.IsValid() {
		return b, fmt.Errorf("%w: invalid destination %v", ErrBadHeader, r.Dest)
	}
	client := r.Client
	if len(client) > maxFieldLength {
		client = client[:maxFieldLength]
	}
	body := 1 + addr.BitLen()/8 + 2
	if client != "" {
		body += 2 + len(client)
	}
	b = append(b, Version, kindConnect)
	b = binary.BigEndian.AppendUint16(b, uint16(body))
	if addr.Is4() {
		b = append(b, 4)
	} else {
		b = append(b, 6)
	}
	b = append(b, addr.AsSlice()...)
	b = binary.BigEndian.AppendUint16(b, r.Dest.Port())
	if client != "" {
		b = append(b, fieldClient, byte(len(client)))
		b = append(b, client...)
	}
	return b, nil
}

// WriteRequest writes r in one Write call.
func WriteRequest(w io.Writer, r Request) error {
	b, err := AppendRequest(make([]byte, 0, 64), r)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// ReadRequest reads one request. It reads exactly the request's bytes and
// never more than MaxRequestLen.
func ReadRequest(rd io.Reader) (Request, error) {
	n, err := readFixed(rd, kindConnect, MaxRequestLen)
	if err != nil {
		return Request{}, err
	}
	var buf [MaxRequestLen]byte
	body := buf[:n]
	if _, err := io.ReadFull(rd, body); err != nil {
		return Request{}, fmt.Errorf("read request body: %w", err)
	}
	return parseRequestBody(body)
}

// readFixed reads the fixed part of a request of the given kind and
// returns the length of its body, which it checks against limit, the
// bound of the whole request.
func readFixed(rd io.Reader, kind byte, limit int) (int, error) {
	got, n, err := readHead(rd)
	if err != nil {
		return 0, err
	}
	if got != kind {
		return 0, fmt.Errorf("%w: kind %d where kind %d belongs", ErrBadHeader, got, kind)
	}
	return checkLength(n, limit)
}

// readHead reads the fixed part of a request of any kind: its kind and
// the length of its body, unchecked.
func readHead(rd io.Reader) (kind byte, n int, _ error) {
	var fixed [requestFixed]byte
	if _, err := io.ReadFull(rd, fixed[:]); err != nil {
		return 0, 0, fmt.Errorf("read request header: %w", err)
	}
	if fixed[0] != Version {
		return 0, 0, &VersionError{Got: fixed[0]}
	}
	return fixed[1], int(binary.BigEndian.Uint16(fixed[2:])), nil
}

// checkLength checks a body's length n against limit, the bound of the
// whole request.
func checkLength(n, limit int) (int, error) {
	if n > limit-requestFixed {
		return 0, fmt.Errorf("%w: length %d over the limit of %d", ErrBadHeader, n, limit)
	}
	return n, nil
}

func parseRequestBody(body []byte) (Request, error) {
	if len(body) < 1 {
		return Request{}, fmt.Errorf("%w: empty body", ErrBadHeader)
	}
	var alen int
	switch body[0] {
	case 4:
		alen = 4
	case 6:
		alen = 16
	default:
		return Request{}, fmt.Errorf("%w: address family %d", ErrBadHeader, body[0])
	}
	if len(body) < 1+alen+2 {
		return Request{}, fmt.Errorf("%w: short address", ErrBadHeader)
	}
	addr, _ := netip.AddrFromSlice(body[1 : 1+alen])
	addr = addr.Unmap() // one form per address, whatever the sender wrote
	port := binary.BigEndian.Uint16(body[1+alen:])
	r := Request{Dest: netip.AddrPortFrom(addr, port)}
	for rest := body[1+alen+2:]; len(rest) > 0; {
		if len(rest) < 2 || len(rest) < 2+int(rest[1]) {
			return Request{}, fmt.Errorf("%w: truncated field", ErrBadHeader)
		}
		typ, val := rest[0], rest[2:2+int(rest[1])]
		if typ == fieldClient {
			r.Client = string(val)
		}
		rest = rest[2+len(val):]
	}
	return r, nil
}

// VersionError reports a header of a version this package does not speak.
type VersionError struct{ Got byte }

func (e *VersionError) Error() string {
	return fmt.Sprintf("stream header version %d, this side speaks %d", e.Got, Version)
}

func (e *VersionError) Is(target error) bool { return target == ErrBadHeader }

// Code is the answer to a request: OK or the reason of a refusal.
type Code uint8

// Codes of a reply to a Request (a connect stream).
const (
	OK         Code = 0 // dialled; bytes follow (a delegate stream: Lease written)
	NotAllowed Code = 1 // destination outside the edge's allow list
	DialFailed Code = 2 // the edge could not connect (refused, unreachable)
	Timeout    Code = 3 // the edge's dial timed out
	Overloaded Code = 4 // too many streams; try again later
	BadRequest Code = 5 // the request header was malformed or of another version
)

// Codes of the gateway's reply to a DelegateRequest, besides OK and
// BadRequest.
const (
	NotLeader     Code = 6  // the sender does not hold its pool's election record
	LeaderExpired Code = 7  // the sender's election record has expired
	NotInPool     Code = 8  // the sender or the delegated node has no pool
	OtherPool     Code = 9  // the delegated node is in another pool than the sender
	UnknownNode   Code = 10 // the sender or the delegated node has no Node object
	BadLease      Code = 11 // not a Lease kube-node-lease/<node> with a renewTime
	Unavailable   Code = 12 // the gateway could not read or write the API objects; another replica may
)

// Codes of the gateway's reply to an ElectionRequest, besides OK,
// BadRequest, NotLeader, LeaderExpired, NotInPool, OtherPool, UnknownNode
// and Unavailable.
const (
	Conflict  Code = 13 // the record changed (or was created, or deleted) since the version the write is based on
	BadRecord Code = 14 // not the pool's record of the kind asked, or not a well-formed one
	NotHolder Code = 15 // the record written names another node than the sender as holder
)

// Code of the gateway's reply to a DelegateRequest or an ElectionRequest
// from a sender refused too often of late: the request was not looked at.
const RateLimited Code = 16

var codeNames = [...]string{"ok", "not_allowed", "dial_failed", "timeout", "overloaded", "bad_request",
	"not_leader", "leader_expired", "not_in_pool", "other_pool", "unknown_node", "bad_lease", "unavailable",
	"conflict", "bad_record", "not_holder", "rate_limited", "not_marked", "no_endpoints"}

// String is the code's metric label ("not_allowed", ...).
func (c Code) String() string { return enumName(codeNames[:], uint8(c), "code") }

// enumName is v's name in names, or kind_<v> for a value without one.
func enumName(names []string, v uint8, kind string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s_%d", kind, v)
}

// Codes lists the codes of a reply to a Request, for pre-creating metric
// series.
func Codes() []Code { return []Code{OK, NotAllowed, DialFailed, Timeout, Overloaded, BadRequest} }

// DelegateCodes lists the codes of a reply to a DelegateRequest, for
// pre-creating metric series.
func DelegateCodes() []Code {
	return []Code{OK, BadRequest, NotLeader, LeaderExpired, NotInPool, OtherPool, UnknownNode, BadLease, Unavailable, RateLimited}
}

// ElectionCodes lists the codes of a reply to an ElectionRequest, for
// pre-creating metric series.
func ElectionCodes() []Code {
	return []Code{OK, BadRequest, Conflict, BadRecord, NotHolder, NotLeader, LeaderExpired, NotInPool, OtherPool, UnknownNode, Unavailable, RateLimited}
}

// Reply is the edge's answer to a Request, and the gateway's to a
// DelegateRequest (and the first part of its ElectionReply).
type Reply struct {
	Code    Code
	Message string // human-readable detail; at most 255 bytes on the wire
}

// WriteReply writes r in one Write call.
func WriteReply(w io.Writer, r Reply) error {
	msg := r.Message
	if len(msg) > maxFieldLength {
		msg = msg[:maxFieldLength]
	}
	b := make([]byte, 0, replyFixed+len(msg))
	b = append(b, Version, byte(r.Code), byte(len(msg)))
	b = append(b, msg...)
	_, err := w.Write(b)
	return err
}

// ReadReply reads one reply. A reply with a code other than OK is returned
// together with a *RefusedError.
func ReadReply(rd io.Reader) (Reply, error) {
	var buf [replyFixed + maxFieldLength]byte
	if _, err := io.ReadFull(rd, buf[:replyFixed]); err != nil {
		return Reply{}, fmt.Errorf("read reply: %w", err)
	}
	if buf[0] != Version {
		return Reply{}, &VersionError{Got: buf[0]}
	}
	n := int(buf[2])
	if _, err := io.ReadFull(rd, buf[replyFixed:replyFixed+n]); err != nil {
		return Reply{}, fmt.Errorf("read reply message: %w", err)
	}
	r := Reply{Code: Code(buf[1]), Message: string(buf[replyFixed : replyFixed+n])}
	if r.Code != OK {
		return r, &RefusedError{Code: r.Code, Message: r.Message}
	}
	return r, nil
}

// RefusedError is a refusal read by ReadReply: from the edge on a connect
// stream, from the gateway on a delegate stream (edgetunnel turns the
// latter into an error of its own).
type RefusedError struct {
	Code    Code
	Message string
}

func (e *RefusedError) Error() string {
	if e.Message == "" {
		return "edge refused: " + e.Code.String()
	}
	return fmt.Sprintf("edge refused: %s: %s", e.Code, e.Message)
}
