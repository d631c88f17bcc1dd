package tunnel

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRequestRoundTrip(t *testing.T) {
	for _, r := range []Request{
		{Dest: netip.MustParseAddrPort("10.0.0.7:10250")},
		{Dest: netip.MustParseAddrPort("[fd00::7]:10255"), Client: "[fd00::1]:40000"},
		{Dest: netip.MustParseAddrPort("127.0.0.1:1"), Client: "10.1.2.3:5"},
		{Dest: netip.MustParseAddrPort("192.168.1.10:65535"), Client: strings.Repeat("x", 255)},
	} {
		var buf bytes.Buffer
		if err := WriteRequest(&buf, r); err != nil {
			t.Fatalf("write %+v: %v", r, err)
		}
		buf.WriteString("payload")
		got, err := ReadRequest(&buf)
		if err != nil {
			t.Fatalf("read %+v: %v", r, err)
		}
		if diff := cmp.Diff(r, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
			t.Errorf("round trip (-want +got):\n%s", diff)
		}
		if rest, _ := io.ReadAll(&buf); string(rest) != "payload" {
			t.Errorf("ReadRequest consumed payload bytes: left %q", rest)
		}
	}
}

func TestRequestMappedAddressIsUnmapped(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteRequest(&buf, Request{Dest: netip.MustParseAddrPort("[::ffff:10.0.0.1]:80")}); err != nil {
		t.Fatal(err)
	}
	got, err := ReadRequest(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if want := netip.MustParseAddrPort("10.0.0.1:80"); got.Dest != want {
		t.Errorf("dest = %v, want %v", got.Dest, want)
	}
}

func TestRequestLongClientIsTruncated(t *testing.T) {
	var buf bytes.Buffer
	r := Request{Dest: netip.MustParseAddrPort("10.0.0.1:80"), Client: strings.Repeat("c", 1000)}
	if err := WriteRequest(&buf, r); err != nil {
		t.Fatal(err)
	}
	if buf.Len() > MaxRequestLen {
		t.Fatalf("request is %d bytes, over MaxRequestLen %d", buf.Len(), MaxRequestLen)
	}
	got, err := ReadRequest(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Client) != 255 {
		t.Errorf("client field is %d bytes, want 255", len(got.Client))
	}
}

func TestReadRequestRejects(t *testing.T) {
	for name, in := range map[string][]byte{
		"empty":            {},
		"short fixed":      {1, 1},
		"version 2":        {2, 1, 0, 7, 4, 10, 0, 0, 1, 0, 80},
		"unknown kind":     {1, 9, 0, 7, 4, 10, 0, 0, 1, 0, 80},
		"over limit":       {1, 1, 0xff, 0xff},
		"just over limit":  {1, 1, 0x01, 0xfd},
		"family 5":         {1, 1, 0, 7, 5, 10, 0, 0, 1, 0, 80},
		"short address":    {1, 1, 0, 4, 6, 0, 0, 0},
		"truncated body":   {1, 1, 0, 20, 4, 10},
		"truncated field":  {1, 1, 0, 9, 4, 10, 0, 0, 1, 0, 80, 1, 5},
		"empty body":       {1, 1, 0, 0},
		"field len beyond": {1, 1, 0, 10, 4, 10, 0, 0, 1, 0, 80, 1, 200, 'x'},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ReadRequest(bytes.NewReader(in))
			if err == nil {
				t.Fatalf("ReadRequest(%v) succeeded", in)
			}
		})
	}
	_, err := ReadRequest(bytes.NewReader([]byte{2, 1, 0, 0}))
	var ve *VersionError
	if !errors.As(err, &ve) || ve.Got != 2 || !errors.Is(err, ErrBadHeader) {
		t.Errorf("version 2: err = %v, want a *VersionError that is ErrBadHeader", err)
	}
}

func TestReadRequestSkipsUnknownFields(t *testing.T) {
	in := []byte{1, 1, 0, 7 + 4 + 3, 4, 10, 0, 0, 9, 0x27, 0x1a, 99, 2, 'z', 'z', fieldClient, 1, 'c'}
	got, err := ReadRequest(bytes.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if got.Dest != netip.MustParseAddrPort("10.0.0.9:10010") || got.Client != "c" {
		t.Errorf("got %+v", got)
	}
}

func TestReplyRoundTrip(t *testing.T) {
	if Conflict.String() != "conflict" || NotHolder.String() != "not_holder" {
		t.Errorf("names: %q %q", Conflict, NotHolder)
	}
	for _, c := range slices.Concat(Codes(), DelegateCodes(), ElectionCodes(), ServiceCodes()) {
		var buf bytes.Buffer
		in := Reply{Code: c, Message: "because " + c.String()}
		if err := WriteReply(&buf, in); err != nil {
			t.Fatal(err)
		}
		got, err := ReadReply(&buf)
		if got != in {
			t.Errorf("reply %v: got %+v", c, got)
		}
		var re *RefusedError
		switch {
		case c == OK && err != nil:
			t.Errorf("OK reply returned error %v", err)
		case c != OK && (!errors.As(err, &re) || re.Code != c):
			t.Errorf("reply %v: err = %v, want *RefusedError with that code", c, err)
		}
	}
}

func TestCodeString(t *testing.T) {
	if NotAllowed.String() != "not_allowed" || Code(77).String() != "code_77" {
		t.Errorf("names: %q %q", NotAllowed, Code(77))
	}
	if NotLeader.String() != "not_leader" || Unavailable.String() != "unavailable" {
		t.Errorf("names: %q %q", NotLeader, Unavailable)
	}
	seen := map[string]bool{}
	if Conflict.String() != "conflict" || NotHolder.String() != "not_holder" {
		t.Errorf("names: %q %q", Conflict, NotHolder)
	}
	for _, c := range slices.Concat(Codes(), DelegateCodes(), ElectionCodes(), ServiceCodes()) {
		if n := c.String(); strings.HasPrefix(n, "code_") {
			t.Errorf("code %d has no name", uint8(c))
		} else {
			seen[n] = true
		}
	}
	if len(seen) != len(codeNames) {
		t.Errorf("Codes, DelegateCodes, ElectionCodes and ServiceCodes name %d codes, %d are defined", len(seen), len(codeNames))
	}
}

// FuzzReadRequest: any bytes give a request of either kind or an error,
// never a panic; no bytes parse as both kinds; a request that parses
// re-encodes to one that parses the same, without reading past its end.
func FuzzReadRequest(f *testing.F) {
	for _, r := range []Request{
		{Dest: netip.MustParseAddrPort("10.0.0.7:10250"), Client: "10.0.0.1:1234"},
		{Dest: netip.MustParseAddrPort("[fd00::7]:10255")},
	} {
		b, _ := AppendRequest(nil, r)
		f.Add(b)
	}
	f.Add([]byte{1, 1, 0xff, 0xff})
	for _, r := range []DelegateRequest{
		{Node: "edge-2", Lease: []byte(`{"metadata":{"name":"edge-2","namespace":"kube-node-lease"}}`)},
		{Node: "a", Lease: []byte{'{'}},
	} {
		b, _ := AppendDelegateRequest(nil, r)
		f.Add(b)
	}
	f.Add([]byte{1, 2, 0xff, 0xff, 1, 'a'})
	f.Add([]byte{1, 2, 0, 3, 5, 'a', 'b'})
	f.Fuzz(func(t *testing.T, in []byte) {
		r, errC := ReadRequest(bytes.NewReader(in))
		d, errD := ReadDelegateRequest(bytes.NewReader(in))
		switch {
		case errC == nil && errD == nil:
			t.Fatalf("%q parses as both %+v and %+v", in, r, d)
		case errC == nil:
			b, err := AppendRequest(nil, r)
			if err != nil {
				t.Fatalf("re-encode %+v: %v", r, err)
			}
			r2, err := ReadRequest(bytes.NewReader(b))
			if err != nil || r2 != r {
				t.Fatalf("re-decode: %+v, %v; want %+v", r2, err, r)
			}
		case errD == nil:
			if len(d.Lease) > MaxLeaseLen {
				t.Fatalf("Lease of %d bytes accepted", len(d.Lease))
			}
			b, err := AppendDelegateRequest(nil, d)
			if err != nil {
				t.Fatalf("re-encode %+v: %v", d, err)
			}
			rd := bytes.NewReader(append(b, "after"...))
			d2, err := ReadDelegateRequest(rd)
			if err != nil || d2.Node != d.Node || !bytes.Equal(d2.Lease, d.Lease) || rd.Len() != len("after") {
				t.Fatalf("re-decode: %+v, %v, %d bytes left; want %+v", d2, err, rd.Len(), d)
			}
		}
	})
}

func FuzzReadReply(f *testing.F) {
	f.Add([]byte{1, 0, 0})
	f.Add([]byte{1, 1, 3, 'a', 'b', 'c'})
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := ReadReply(bytes.NewReader(in))
		if err == nil && r.Code != OK {
			t.Fatalf("refusal %+v without error", r)
		}
	})
}
