package tunnel

import (
	"encoding/binary"
	"fmt"
	"io"
)

// A probe is the edge's question "are you still there?", asked on a
// stream of its own when it has heard nothing from a gateway replica for
// longer than a keepalive period (see the package doc, Liveness probes).
// Its body is padding: a gateway that restarted no longer knows the
// connection and answers a packet of an unknown connection with a QUIC
// stateless reset only if the packet is longer than 42 bytes (quic-go's
// protocol.MinStatelessResetSize), which the keepalive PINGs are not.

// ProbePadding is the length of a probe's body, so that the QUIC packet
// that carries the probe is well over 42 bytes (with its STREAM frame
// header, the packet header and the 16-byte AEAD tag, about 70).
const ProbePadding = 40

// MaxProbeRequestLen bounds a probe request, fixed part included: a
// reader accepts up to 255 bytes of padding.
const MaxProbeRequestLen = requestFixed + maxFieldLength

// AppendProbeRequest appends the wire form of a probe to b.
func AppendProbeRequest(b []byte) []byte {
	b = append(b, Version, kindProbe)
	b = binary.BigEndian.AppendUint16(b, ProbePadding)
	return append(b, make([]byte, ProbePadding)...)
}

// WriteProbeRequest writes a probe in one Write call.
func WriteProbeRequest(w io.Writer) error {
	_, err := w.Write(AppendProbeRequest(make([]byte, 0, requestFixed+ProbePadding)))
	return err
}

// readProbeBody reads and discards a probe's body of n bytes.
func readProbeBody(rd io.Reader, n int) error {
	var buf [maxFieldLength]byte
	if _, err := io.ReadFull(rd, buf[:n]); err != nil {
		return fmt.Errorf("read probe padding: %w", err)
	}
	return nil
}
