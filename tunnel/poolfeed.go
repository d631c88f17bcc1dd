package tunnel

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// MaxPoolFeedRequestLen bounds a pool feed request, fixed part included:
// the pool's length and name, and up to 255 bytes a later version may
// add (a reader skips them).
const MaxPoolFeedRequestLen = requestFixed + 1 + maxPoolLen + maxFieldLength

// PoolFeedRequest is what a pool's leader asks of the gateway on a stream
// it opens: the signed feed of its pool's data (package poolstore/feed).
// The gateway answers with a Reply; after an OK one the stream carries
// the feed's frames (feed.Writer's output) until either side ends it.
// The sender is the node of the connection's client certificate; the
// request never names it.
type PoolFeedRequest struct {
	// Pool is the sender's pool (its Node's pool label).
	Pool string
}

// AppendPoolFeedRequest appends the wire form of r to b.
func AppendPoolFeedRequest(b []byte, r PoolFeedRequest) ([]byte, error) {
	if err := checkPoolFeed(r); err != nil {
		return b, err
	}
	b = append(b, Version, kindPoolFeed)
	b = binary.BigEndian.AppendUint16(b, uint16(1+len(r.Pool)))
	b = append(b, byte(len(r.Pool)))
	return append(b, r.Pool...), nil
}

// WritePoolFeedRequest writes r in one Write call.
func WritePoolFeedRequest(w io.Writer, r PoolFeedRequest) error {
	b, err := AppendPoolFeedRequest(nil, r)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// ReadPoolFeedRequest reads one pool feed request. It reads exactly the
// request's bytes and never more than MaxPoolFeedRequestLen. A request of
// another kind is an ErrBadHeader.
func ReadPoolFeedRequest(rd io.Reader) (PoolFeedRequest, error) {
	n, err := readFixed(rd, kindPoolFeed, MaxPoolFeedRequestLen)
	if err != nil {
		return PoolFeedRequest{}, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		return PoolFeedRequest{}, fmt.Errorf("read request body: %w", err)
	}
	return parsePoolFeedBody(body)
}

// parsePoolFeedBody parses the body of a pool feed request; bytes after
// the pool name are skipped.
func parsePoolFeedBody(body []byte) (PoolFeedRequest, error) {
	if len(body) < 1 || len(body) < 1+int(body[0]) {
		return PoolFeedRequest{}, fmt.Errorf("%w: truncated pool name", ErrBadHeader)
	}
	r := PoolFeedRequest{Pool: string(body[1 : 1+int(body[0])])}
	if err := checkPoolFeed(r); err != nil {
		return PoolFeedRequest{}, err
	}
	return r, nil
}

// checkPoolFeed checks what both sides of a PoolFeedRequest require.
func checkPoolFeed(r PoolFeedRequest) error {
	if r.Pool == "" {
		return fmt.Errorf("%w: no pool", ErrBadHeader)
	}
	if errs := validation.IsValidLabelValue(r.Pool); len(errs) > 0 {
		return fmt.Errorf("%w: pool %q: %s", ErrBadHeader, r.Pool, strings.Join(errs, "; "))
	}
	return nil
}

// PoolFeedCodes lists the codes of a reply to a PoolFeedRequest, for
// pre-creating metric series.
func PoolFeedCodes() []Code {
	return []Code{OK, BadRequest, NotLeader, LeaderExpired, NotInPool, OtherPool, UnknownNode, Unavailable}
}
