package poolstore

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"

	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/replica"
)

// The replication stream is newline-delimited JSON: one frame per line,
// each flushed as it is written (see README.md, "Replication").
const (
	// frameSnapshot begins a snapshot: the leader's epoch, revision and
	// resources, and how many objects follow in objects frames.
	frameSnapshot = "snapshot"
	// frameObjects carries objects of the snapshot begun last.
	frameObjects = "objects"
	// frameChanges carries contiguous changes of the leader's log.
	frameChanges = "changes"
	// frameSync carries the leader's SyncedAt; it is also the stream's
	// keepalive.
	frameSync = "sync"
	// frameTrust carries the gateway certificate chains that verify the
	// leader's statements: first in every stream, again when they change.
	frameTrust = "trust"
)

var frameTypes = []string{frameSnapshot, frameObjects, frameChanges, frameSync, frameTrust}

// Limits of the stream.
const (
	// maxFrameBytes bounds a frame a follower accepts. The leader keeps
	// frames near frameTargetBytes; one object alone may exceed that
	// (etcd's limit on an object is 1.5 MiB), never this.
	maxFrameBytes = 16 << 20
	// frameTargetBytes and frameMaxItems bound how many objects or
	// changes the leader puts in one frame: a frame is encoded whole, on
	// the leader once per follower at the same time and kept in the
	// follower's read buffer, so small frames keep the peak RSS of a
	// snapshot to a whole pool low (1 MiB frames cost the leader of 10
	// nodes ~10 MiB more at its first sync).
	frameTargetBytes = 256 << 10
	frameMaxItems    = 250
)

// frame is one line of the stream. Epoch and Rev are the leader's store's
// position when it wrote the frame (for a snapshot: the snapshot's).
type frame struct {
	Type  string `json:"type"`
	Epoch string `json:"epoch,omitempty"`
	Rev   uint64 `json:"rev"`

	// snapshot
	Resources map[string]uint64 `json:"resources,omitempty"`
	Count     int               `json:"count,omitempty"`
	// objects (Added changes at the snapshot's revision) and changes
	Items []replica.Change `json:"items,omitempty"`
	// snapshot: each resource's attestation (feed.Signed JSON).
	Attests map[string]json.RawMessage `json:"attests,omitempty"`
	// sync, snapshot: the leader's last signed mark (feed.Signed JSON).
	Mark json.RawMessage `json:"mark,omitempty"`
	// trust, snapshot: gateway certificate chains (DER, leaf first).
	Chains [][][]byte `json:"chains,omitempty"`
}

// batches splits items into runs of at most frameMaxItems items and about
// frameTargetBytes of objects each.
func batches(items []replica.Change) [][]replica.Change {
	var out [][]replica.Change
	for len(items) > 0 {
		n, size := 0, 0
		for n < len(items) && n < frameMaxItems && (n == 0 || size+len(items[n].Object) <= frameTargetBytes) {
			size += len(items[n].Object) + 128 // and the change's other fields
			n++
		}
		out = append(out, items[:n])
		items = items[n:]
	}
	return out
}

// frameReader reads frames from a stream, each at most maxFrameBytes.
type frameReader struct {
	sc *bufio.Scanner
}

func newFrameReader(r io.Reader) *frameReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxFrameBytes)
	sc.Split(feed.ScanLines)
	return &frameReader{sc: sc}
}

// next returns the next frame and its size in bytes; io.EOF at the end of
// the stream.
func (fr *frameReader) next() (frame, int, error) {
	if !fr.sc.Scan() {
		if err := fr.sc.Err(); err != nil {
			return frame{}, 0, fmt.Errorf("read frame: %w", err)
		}
		return frame{}, 0, io.EOF
	}
	line := fr.sc.Bytes()
	var f frame
	if err := json.Unmarshal(line, &f); err != nil {
		return frame{}, len(line), fmt.Errorf("decode frame: %w", err)
	}
	return f, len(line) + 1, nil
}
