package tunnel

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestServiceRequestRoundTrip(t *testing.T) {
	long := strings.Repeat("s", 63)
	for _, r := range []ServiceRequest{
		{Namespace: "default", Name: "api", Port: 443},
		{Namespace: long, Name: long, Port: 65535},
		{Namespace: "a", Name: "b-1", Port: 1},
	} {
		b, err := AppendServiceRequest(nil, r)
		if err != nil {
			t.Fatalf("append %v: %v", r, err)
		}
		if len(b) > MaxServiceRequestLen || len(b) > MaxEdgeRequestLen {
			t.Fatalf("request of %d bytes, over the limits", len(b))
		}
		rd := bytes.NewReader(append(b, "bytes"...))
		er, err := ReadEdgeRequest(rd)
		if err != nil || er.Service == nil || er.PoolFeed != nil || er.Delegate != nil || er.Election != nil || er.Probe {
			t.Fatalf("ReadEdgeRequest: %+v, %v; want the service request", er, err)
		}
		if *er.Service != r {
			t.Errorf("read %v, sent %v", *er.Service, r)
		}
		if rd.Len() != len("bytes") {
			t.Errorf("ReadEdgeRequest read past the request: %d bytes left", rd.Len())
		}
	}
}

func TestServiceRequestWireForm(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteServiceRequest(&buf, ServiceRequest{Namespace: "ns", Name: "s", Port: 443}); err != nil {
		t.Fatal(err)
	}
	if want := []byte{1, 6, 0, 7, 2, 'n', 's', 1, 's', 0x01, 0xbb}; !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("wire form %v, want %v", buf.Bytes(), want)
	}
	// Bytes after the port (a later version's) are skipped.
	got, err := ReadEdgeRequest(bytes.NewReader([]byte{1, 6, 0, 9, 2, 'n', 's', 1, 's', 0x01, 0xbb, 9, 9}))
	if err != nil || got.Service == nil || *got.Service != (ServiceRequest{Namespace: "ns", Name: "s", Port: 443}) {
		t.Errorf("with trailing bytes: %+v, %v", got, err)
	}
}

func TestServiceRequestRejects(t *testing.T) {
	for name, r := range map[string]ServiceRequest{
		"no namespace":   {Name: "s", Port: 1},
		"no name":        {Namespace: "ns", Port: 1},
		"dotted name":    {Namespace: "ns", Name: "a.b", Port: 1},
		"upper case":     {Namespace: "NS", Name: "s", Port: 1},
		"long namespace": {Namespace: strings.Repeat("n", 64), Name: "s", Port: 1},
		"port 0":         {Namespace: "ns", Name: "s"},
	} {
		if b, err := AppendServiceRequest(nil, r); !errors.Is(err, ErrBadHeader) || len(b) != 0 {
			t.Errorf("append %s: %v, %d bytes; want ErrBadHeader", name, err, len(b))
		}
	}
	for name, wire := range map[string][]byte{
		"truncated name": {1, 6, 0, 4, 2, 'n', 's', 3},
		"no port":        {1, 6, 0, 5, 2, 'n', 's', 1, 's'},
		"port 0":         {1, 6, 0, 7, 2, 'n', 's', 1, 's', 0, 0},
		"bad name":       {1, 6, 0, 8, 2, 'n', 's', 2, 'a', '/', 0, 1},
		"too long":       {1, 6, 0x02, 0x00},
	} {
		if r, err := ReadEdgeRequest(bytes.NewReader(wire)); !errors.Is(err, ErrBadHeader) {
			t.Errorf("read %s: %+v, %v; want ErrBadHeader", name, r, err)
		}
	}
}

// FuzzServiceRequest: whatever the bytes, a service request either fails
// as a bad header or reads back as what it re-encodes to.
func FuzzServiceRequest(f *testing.F) {
	for _, r := range []ServiceRequest{{Namespace: "default", Name: "api", Port: 443}, {Namespace: "a", Name: "b", Port: 1}} {
		b, _ := AppendServiceRequest(nil, r)
		f.Add(b)
	}
	f.Add([]byte{1, 6, 0, 9, 2, 'n', 's', 1, 's', 0x01, 0xbb, 9, 9})
	f.Fuzz(func(t *testing.T, in []byte) {
		er, err := ReadEdgeRequest(bytes.NewReader(in))
		if err != nil || er.Service == nil {
			return
		}
		b, err := AppendServiceRequest(nil, *er.Service)
		if err != nil {
			t.Fatalf("a request read (%+v) does not encode: %v", *er.Service, err)
		}
		again, err := ReadEdgeRequest(bytes.NewReader(b))
		if err != nil || again.Service == nil || *again.Service != *er.Service {
			t.Fatalf("re-encoded %+v reads back as %+v, %v", *er.Service, again.Service, err)
		}
	})
}
