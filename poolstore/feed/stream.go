package feed

import (
	"bufio"
	"bytes"
	"compress/flate"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The feed stream, from a gateway replica to a pool leader through the
// leader's tunnel, is newline-delimited JSON Frames, deflated (each frame
// flushed as written). It starts with a FrameCerts, then a whole-resource
// unit per resource (Replace), then units as the cloud changes and a mark
// every MarkEvery.
const (
	// FrameCerts carries the signing chain (leaf first, DER); sent first
	// and again whenever the serving certificate changes.
	FrameCerts = "certs"
	// FrameUnit carries items of one resource. A unit is one or more
	// consecutive frames of one resource; the last carries Attest, the
	// resource's state after the unit. With Replace set on its first
	// frame the unit's items are the whole resource.
	FrameUnit = "unit"
	// FrameMark carries a signed mark.
	FrameMark = "mark"
)

// Frame is one line of the feed stream.
type Frame struct {
	Type     string   `json:"type"`
	Chain    [][]byte `json:"chain,omitempty"`
	Resource string   `json:"resource,omitempty"`
	Replace  bool     `json:"replace,omitempty"`
	Items    []Item   `json:"items,omitempty"`
	Attest   Signed   `json:"attest,omitzero"`
	Mark     Signed   `json:"mark,omitzero"`
}

// Item is an object of a unit: a watch event's type (ADDED, MODIFIED,
// DELETED; ADDED in a Replace) and the object's JSON with kind and
// apiVersion set, as the gateway encoded it (its bytes are hashed).
type Item struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// Limits of the stream: a frame the reader accepts, and the items and
// bytes a writer puts in one frame of a unit.
const (
	MaxFrameBytes    = 16 << 20
	FrameTargetBytes = 256 << 10
	FrameMaxItems    = 250
)

// Writer writes frames, deflated, flushing each.
type Writer struct {
	w  io.Writer
	fw *flate.Writer
	n  int64 // bytes of JSON written (before deflate)
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer {
	fw, _ := flate.NewWriter(w, flate.BestSpeed) // the level is valid
	return &Writer{w: w, fw: fw}
}

// Write writes f and flushes it to the underlying writer.
func (w *Writer) Write(f Frame) error {
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode %s frame: %w", f.Type, err)
	}
	return w.WriteLine(append(b, '\n'))
}

// WriteLine writes an encoded frame (ending in a newline) and flushes it.
func (w *Writer) WriteLine(line []byte) error {
	if _, err := w.fw.Write(line); err != nil {
		return err
	}
	w.n += int64(len(line))
	return w.fw.Flush()
}

// Close ends the deflate stream.
func (w *Writer) Close() error { return w.fw.Close() }

// Batches splits items into runs of at most FrameMaxItems items and about
// FrameTargetBytes each.
func Batches(items []Item) [][]Item {
	var out [][]Item
	for len(items) > 0 {
		n, size := 0, 0
		for n < len(items) && n < FrameMaxItems && (n == 0 || size+len(items[n].Object) <= FrameTargetBytes) {
			size += len(items[n].Object) + 32
			n++
		}
		out = append(out, items[:n])
		items = items[n:]
	}
	return out
}

// Reader reads frames from a deflated stream.
type Reader struct {
	sc *bufio.Scanner
	fr io.ReadCloser
}

// NewReader returns a Reader on r.
func NewReader(r io.Reader) *Reader {
	fr := flate.NewReader(r)
	sc := bufio.NewScanner(fr)
	sc.Buffer(make([]byte, 0, 64<<10), MaxFrameBytes)
	sc.Split(ScanLines)
	return &Reader{sc: sc, fr: fr}
}

// ScanLines is a bufio.SplitFunc for NDJSON streams (this feed and the
// pool's replication stream): lines each ending in a newline, a line cut
// short by the end of the stream an error, not a frame.
func ScanLines(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return 0, nil, io.ErrUnexpectedEOF
	}
	return 0, nil, nil
}

// Next returns the next frame and its size (inflated); io.EOF at the end.
func (r *Reader) Next() (Frame, int, error) {
	if !r.sc.Scan() {
		if err := r.sc.Err(); err != nil {
			return Frame{}, 0, fmt.Errorf("read feed frame: %w", err)
		}
		return Frame{}, 0, io.EOF
	}
	line := r.sc.Bytes()
	var f Frame
	if err := json.Unmarshal(line, &f); err != nil {
		return Frame{}, len(line), fmt.Errorf("decode feed frame: %w", err)
	}
	switch f.Type {
	case FrameCerts, FrameUnit, FrameMark:
	default:
		return Frame{}, len(line), errors.New("feed frame of unknown type " + f.Type)
	}
	return f, len(line) + 1, nil
}
