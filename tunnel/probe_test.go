package tunnel

import (
	"bytes"
	"testing"
)

func TestProbeRequest(t *testing.T) {
	var b bytes.Buffer
	if err := WriteProbeRequest(&b); err != nil {
		t.Fatal(err)
	}
	// The stream bytes alone exceed the 42 bytes below which a gateway
	// that lost the connection sends no stateless reset.
	if b.Len() <= 42 {
		t.Fatalf("probe of %d bytes, want more than 42", b.Len())
	}
	b.WriteString("next")
	got, err := ReadEdgeRequest(&b)
	if err != nil || !got.Probe || got.Delegate != nil || got.Election != nil {
		t.Fatalf("ReadEdgeRequest of a probe: %+v, %v", got, err)
	}
	if b.String() != "next" {
		t.Fatalf("ReadEdgeRequest left %q, want the bytes after the probe", b.String())
	}
	// Any padding up to 255 bytes is a probe.
	long := append([]byte{Version, kindProbe, 0, 255}, make([]byte, 255)...)
	if got, err := ReadEdgeRequest(bytes.NewReader(long)); err != nil || !got.Probe {
		t.Fatalf("ReadEdgeRequest of a probe with 255 bytes of padding: %+v, %v", got, err)
	}
}
