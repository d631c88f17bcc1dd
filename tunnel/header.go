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

const (
	kindConnect    = 1
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
	var fixed [requestFixed]byte
	if _, err := io.ReadFull(rd, fixed[:]); err != nil {
		return Request{}, fmt.Errorf("read request header: %w", err)
	}
	if fixed[0] != Version {
		return Request{}, &VersionError{Got: fixed[0]}
	}
	if fixed[1] != kindConnect {
		return Request{}, fmt.Errorf("%w: unknown kind %d", ErrBadHeader, fixed[1])
	}
	n := int(binary.BigEndian.Uint16(fixed[2:]))
	if n > MaxRequestLen-requestFixed {
		return Request{}, fmt.Errorf("%w: length %d over the limit of %d", ErrBadHeader, n, MaxRequestLen)
	}
	var buf [MaxRequestLen]byte
	body := buf[:n]
	if _, err := io.ReadFull(rd, body); err != nil {
		return Request{}, fmt.Errorf("read request body: %w", err)
	}
	return parseRequestBody(body)
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

// Code is the edge's answer to a Request.
type Code uint8

const (
	OK         Code = 0 // dialled; bytes follow
	NotAllowed Code = 1 // destination outside the edge's allow list
	DialFailed Code = 2 // the edge could not connect (refused, unreachable)
	Timeout    Code = 3 // the edge's dial timed out
	Overloaded Code = 4 // too many streams; try again later
	BadRequest Code = 5 // the request header was malformed or of another version
)

var codeNames = [...]string{"ok", "not_allowed", "dial_failed", "timeout", "overloaded", "bad_request"}

// String is the code's metric label ("not_allowed", ...).
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("code_%d", uint8(c))
}

// Codes lists every known code, for pre-creating metric series.
func Codes() []Code { return []Code{OK, NotAllowed, DialFailed, Timeout, Overloaded, BadRequest} }

// Reply is the edge's answer to a Request.
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

// RefusedError is a refusal from the edge.
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
