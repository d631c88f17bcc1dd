package tunnel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"
)

func TestDelegateRequestRoundTrip(t *testing.T) {
	lease := []byte(`{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"edge-2","namespace":"kube-node-lease"},"spec":{"holderIdentity":"edge-2","leaseDurationSeconds":40,"renewTime":"2025-01-02T03:04:05.000000Z"}}`)
	for _, r := range []DelegateRequest{
		{Node: "edge-2", Lease: lease},
		{Node: strings.Repeat("n", 253), Lease: bytes.Repeat([]byte{'x'}, MaxLeaseLen)},
		{Node: "a.b-c", Lease: []byte("{}")},
	} {
		var buf bytes.Buffer
		if err := WriteDelegateRequest(&buf, r); err != nil {
			t.Fatalf("write %s: %v", r.Node, err)
		}
		if buf.Len() > MaxDelegateRequestLen {
			t.Fatalf("request of %d bytes, over MaxDelegateRequestLen", buf.Len())
		}
		buf.WriteString("after")
		got, err := ReadDelegateRequest(&buf)
		if err != nil {
			t.Fatalf("read %s: %v", r.Node, err)
		}
		if got.Node != r.Node || !bytes.Equal(got.Lease, r.Lease) {
			t.Errorf("round trip: got node %q lease %d bytes, want %q %d bytes", got.Node, len(got.Lease), r.Node, len(r.Lease))
		}
		if rest, _ := io.ReadAll(&buf); string(rest) != "after" {
			t.Errorf("ReadDelegateRequest read past the request: left %q", rest)
		}
	}
}

func TestDelegateRequestWireForm(t *testing.T) {
	b, err := AppendDelegateRequest(nil, DelegateRequest{Node: "e1", Lease: []byte("{}")})
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte{1, 2, 0, 5, 2, 'e', '1', '{', '}'}; !bytes.Equal(b, want) {
		t.Errorf("wire form %v, want %v", b, want)
	}
}

func TestWriteDelegateRequestRejects(t *testing.T) {
	for name, r := range map[string]DelegateRequest{
		"no node":       {Lease: []byte("{}")},
		"bad node":      {Node: "Edge_1", Lease: []byte("{}")},
		"long node":     {Node: strings.Repeat("n", 254), Lease: []byte("{}")},
		"no lease":      {Node: "edge-1"},
		"lease too big": {Node: "edge-1", Lease: make([]byte, MaxLeaseLen+1)},
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteDelegateRequest(&buf, r); !errors.Is(err, ErrBadHeader) || buf.Len() != 0 {
				t.Fatalf("err = %v with %d bytes written, want ErrBadHeader and nothing written", err, buf.Len())
			}
		})
	}
}

func TestReadDelegateRequestRejects(t *testing.T) {
	body := func(b ...byte) []byte {
		return append(binary.BigEndian.AppendUint16([]byte{1, 2}, uint16(len(b))), b...)
	}
	connect, _ := AppendRequest(nil, Request{Dest: netip.MustParseAddrPort("10.0.0.1:10250")})
	for name, in := range map[string][]byte{
		"empty":          {},
		"short fixed":    {1, 2, 0},
		"version 2":      {2, 2, 0, 4, 1, 'a', '{', '}'},
		"connect kind":   connect,
		"empty body":     body(),
		"node too long":  body(5, 'a', 'b'),
		"no lease":       body(1, 'a'),
		"empty node":     body(0, '{', '}'),
		"bad node":       body(2, 'A', '_', '{', '}'),
		"truncated body": {1, 2, 0, 10, 1, 'a', '{'},
	} {
		t.Run(name, func(t *testing.T) {
			if r, err := ReadDelegateRequest(bytes.NewReader(in)); err == nil {
				t.Fatalf("ReadDelegateRequest(%v) = %+v, want an error", in, r)
			}
		})
	}
	// A delegate request is no connect request either.
	b, _ := AppendDelegateRequest(nil, DelegateRequest{Node: "edge-1", Lease: []byte("{}")})
	if _, err := ReadRequest(bytes.NewReader(b)); !errors.Is(err, ErrBadHeader) {
		t.Errorf("ReadRequest of a delegate request: %v, want ErrBadHeader", err)
	}
}

// A sender that announces 64 KiB and sends less is not waited for beyond
// what it sent: the reader returns the short read's error.
func TestReadDelegateRequestShortBody(t *testing.T) {
	_, err := ReadDelegateRequest(bytes.NewReader([]byte{1, 2, 0xff, 0xff, 1, 'a'}))
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v, want io.ErrUnexpectedEOF", err)
	}
}
