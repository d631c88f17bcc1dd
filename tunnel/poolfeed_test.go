package tunnel

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestPoolFeedRequestRoundTrip(t *testing.T) {
	for _, pool := range []string{"shop", "a.b-c_d", strings.Repeat("p", 63)} {
		b, err := AppendPoolFeedRequest(nil, PoolFeedRequest{Pool: pool})
		if err != nil {
			t.Fatalf("append %s: %v", pool, err)
		}
		if len(b) > MaxPoolFeedRequestLen || len(b) > MaxEdgeRequestLen {
			t.Fatalf("request of %d bytes, over the limits", len(b))
		}
		rd := bytes.NewReader(append(b, "frames"...))
		got, err := ReadPoolFeedRequest(rd)
		if err != nil || got.Pool != pool {
			t.Fatalf("read: %+v, %v; want pool %s", got, err, pool)
		}
		if rest, _ := io.ReadAll(rd); string(rest) != "frames" {
			t.Errorf("ReadPoolFeedRequest read past the request: left %q", rest)
		}
		rd = bytes.NewReader(append(b, "frames"...))
		er, err := ReadEdgeRequest(rd)
		if err != nil || er.PoolFeed == nil || er.Delegate != nil || er.Election != nil || er.Probe {
			t.Fatalf("ReadEdgeRequest: %+v, %v; want the pool feed request", er, err)
		}
		if er.PoolFeed.Pool != pool {
			t.Errorf("ReadEdgeRequest: pool %q, want %q", er.PoolFeed.Pool, pool)
		}
		if rd.Len() != len("frames") {
			t.Errorf("ReadEdgeRequest read past the request: %d bytes left", rd.Len())
		}
	}
}

func TestPoolFeedRequestWireForm(t *testing.T) {
	var buf bytes.Buffer
	if err := WritePoolFeedRequest(&buf, PoolFeedRequest{Pool: "p1"}); err != nil {
		t.Fatal(err)
	}
	if want := []byte{1, 5, 0, 3, 2, 'p', '1'}; !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("wire form %v, want %v", buf.Bytes(), want)
	}
	// Bytes after the pool name (a later version's) are skipped.
	got, err := ReadPoolFeedRequest(bytes.NewReader([]byte{1, 5, 0, 5, 2, 'p', '1', 9, 9}))
	if err != nil || got.Pool != "p1" {
		t.Errorf("with trailing bytes: %+v, %v", got, err)
	}
}

func TestPoolFeedRequestRejects(t *testing.T) {
	for name, pool := range map[string]string{"no pool": "", "bad pool": "a/b", "long pool": strings.Repeat("p", 64)} {
		if b, err := AppendPoolFeedRequest(nil, PoolFeedRequest{Pool: pool}); !errors.Is(err, ErrBadHeader) || len(b) != 0 {
			t.Errorf("append %s: %v, %d bytes; want ErrBadHeader", name, err, len(b))
		}
	}
	for name, wire := range map[string][]byte{
		"truncated name": {1, 5, 0, 2, 5, 'p'},
		"empty name":     {1, 5, 0, 1, 0},
		"bad name":       {1, 5, 0, 4, 3, 'a', '/', 'b'},
		"too long":       {1, 5, 0x01, 0x80},
		"other kind":     {1, 3, 0, 1, 0},
	} {
		if _, err := ReadPoolFeedRequest(bytes.NewReader(wire)); !errors.Is(err, ErrBadHeader) {
			t.Errorf("read %s: %v, want ErrBadHeader", name, err)
		}
	}
}
