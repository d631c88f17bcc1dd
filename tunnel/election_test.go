package tunnel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const recordJSON = `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"pool-shop","namespace":"tether-system","resourceVersion":"42","annotations":{"control-plane.alpha.kubernetes.io/leader":"{\"holderIdentity\":\"edge-1\",\"leaseDurationSeconds\":15,\"acquireTime\":\"2025-01-02T03:04:05Z\",\"renewTime\":\"2025-01-02T03:04:05Z\",\"leaderTransitions\":0}"}}}`

func TestElectionRequestRoundTrip(t *testing.T) {
	for _, r := range []ElectionRequest{
		{Op: ElectionCreate, Record: RecordElection, Pool: "shop", ConfigMap: []byte(recordJSON)},
		{Op: ElectionUpdate, Record: RecordSync, Pool: "a.b-c_d", ConfigMap: []byte("{}")},
		{Op: ElectionUpdate, Record: RecordElection, Pool: strings.Repeat("p", 63), ConfigMap: bytes.Repeat([]byte{'x'}, MaxConfigMapLen)},
	} {
		b, err := AppendElectionRequest(nil, r)
		if err != nil {
			t.Fatalf("append %s: %v", r.Pool, err)
		}
		if len(b) > MaxElectionRequestLen || len(b) > MaxEdgeRequestLen {
			t.Fatalf("request of %d bytes, over MaxElectionRequestLen", len(b))
		}
		rd := bytes.NewReader(append(b, "after"...))
		got, err := ReadElectionRequest(rd)
		if err != nil {
			t.Fatalf("read %s: %v", r.Pool, err)
		}
		if diff := cmp.Diff(r, got); diff != "" {
			t.Errorf("round trip (-sent +read):\n%s", diff)
		}
		if rest, _ := io.ReadAll(rd); string(rest) != "after" {
			t.Errorf("ReadElectionRequest read past the request: left %q", rest)
		}
		// The gateway reads it as an edge's request of either kind.
		rd = bytes.NewReader(append(b, "after"...))
		er, err := ReadEdgeRequest(rd)
		if err != nil || er.Delegate != nil || er.Election == nil {
			t.Fatalf("ReadEdgeRequest: %+v, %v; want the election request", er, err)
		}
		if diff := cmp.Diff(r, *er.Election); diff != "" {
			t.Errorf("ReadEdgeRequest (-sent +read):\n%s", diff)
		}
		if rd.Len() != len("after") {
			t.Errorf("ReadEdgeRequest read past the request: %d bytes left", rd.Len())
		}
	}
}

func TestElectionRequestWireForm(t *testing.T) {
	b, err := AppendElectionRequest(nil, ElectionRequest{Op: ElectionUpdate, Record: RecordSync, Pool: "p1", ConfigMap: []byte("{}")})
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte{1, 3, 0, 7, 2, 2, 2, 'p', '1', '{', '}'}; !bytes.Equal(b, want) {
		t.Errorf("wire form %v, want %v", b, want)
	}
}

func TestAppendElectionRequestRejects(t *testing.T) {
	cm := []byte("{}")
	for name, r := range map[string]ElectionRequest{
		"no op":           {Record: RecordElection, Pool: "p", ConfigMap: cm},
		"op 3":            {Op: 3, Record: RecordElection, Pool: "p", ConfigMap: cm},
		"no record kind":  {Op: ElectionCreate, Pool: "p", ConfigMap: cm},
		"record kind 3":   {Op: ElectionCreate, Record: 3, Pool: "p", ConfigMap: cm},
		"no pool":         {Op: ElectionCreate, Record: RecordElection, ConfigMap: cm},
		"bad pool":        {Op: ElectionCreate, Record: RecordElection, Pool: "a/b", ConfigMap: cm},
		"long pool":       {Op: ElectionCreate, Record: RecordElection, Pool: strings.Repeat("p", 64), ConfigMap: cm},
		"no ConfigMap":    {Op: ElectionCreate, Record: RecordElection, Pool: "p"},
		"ConfigMap large": {Op: ElectionCreate, Record: RecordElection, Pool: "p", ConfigMap: make([]byte, MaxConfigMapLen+1)},
	} {
		t.Run(name, func(t *testing.T) {
			if b, err := AppendElectionRequest(nil, r); !errors.Is(err, ErrBadHeader) || len(b) != 0 {
				t.Fatalf("err = %v with %d bytes, want ErrBadHeader and nothing", err, len(b))
			}
		})
	}
}

func TestReadElectionRequestRejects(t *testing.T) {
	body := func(b ...byte) []byte {
		return append(binary.BigEndian.AppendUint16([]byte{1, 3}, uint16(len(b))), b...)
	}
	connect, _ := AppendRequest(nil, Request{Dest: netip.MustParseAddrPort("10.0.0.1:10250")})
	delegate, _ := AppendDelegateRequest(nil, DelegateRequest{Node: "edge-1", Lease: []byte("{}")})
	for name, in := range map[string][]byte{
		"empty":           {},
		"short fixed":     {1, 3, 0},
		"version 2":       {2, 3, 0, 5, 1, 1, 1, 'p', '{'},
		"connect kind":    connect,
		"delegate kind":   delegate,
		"empty body":      body(),
		"short body":      body(1, 1),
		"pool too long":   body(1, 1, 5, 'a', 'b'),
		"no ConfigMap":    body(1, 1, 1, 'p'),
		"empty pool":      body(1, 1, 0, '{', '}'),
		"bad pool":        body(1, 1, 2, 'a', '/', '{', '}'),
		"op 0":            body(0, 1, 1, 'p', '{', '}'),
		"op 3":            body(3, 1, 1, 'p', '{', '}'),
		"record kind 0":   body(1, 0, 1, 'p', '{', '}'),
		"record kind 9":   body(1, 9, 1, 'p', '{', '}'),
		"truncated body":  {1, 3, 0, 10, 1, 1, 1, 'p', '{'},
		"length too long": {1, 3, 0xff, 0xff},
	} {
		t.Run(name, func(t *testing.T) {
			if r, err := ReadElectionRequest(bytes.NewReader(in)); err == nil {
				t.Fatalf("ReadElectionRequest(%v) = %+v, want an error", in, r)
			}
		})
	}
	// An election request is no connect or delegate request either.
	b, _ := AppendElectionRequest(nil, ElectionRequest{Op: ElectionCreate, Record: RecordElection, Pool: "p", ConfigMap: []byte("{}")})
	if _, err := ReadRequest(bytes.NewReader(b)); !errors.Is(err, ErrBadHeader) {
		t.Errorf("ReadRequest of an election request: %v, want ErrBadHeader", err)
	}
	if _, err := ReadDelegateRequest(bytes.NewReader(b)); !errors.Is(err, ErrBadHeader) {
		t.Errorf("ReadDelegateRequest of an election request: %v, want ErrBadHeader", err)
	}
}

// A sender that announces 64 KiB and sends less is not waited for beyond
// what it sent.
func TestReadElectionRequestShortBody(t *testing.T) {
	_, err := ReadElectionRequest(bytes.NewReader([]byte{1, 3, 0xff, 0xfe, 1, 1, 1, 'p'}))
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v, want io.ErrUnexpectedEOF", err)
	}
}

func TestReadEdgeRequest(t *testing.T) {
	d := DelegateRequest{Node: "edge-2", Lease: []byte("{}")}
	b, _ := AppendDelegateRequest(nil, d)
	got, err := ReadEdgeRequest(bytes.NewReader(b))
	if err != nil || got.Election != nil || got.Delegate == nil || got.Delegate.Node != d.Node || !bytes.Equal(got.Delegate.Lease, d.Lease) {
		t.Fatalf("ReadEdgeRequest of a delegate request: %+v, %v", got, err)
	}
	connect, _ := AppendRequest(nil, Request{Dest: netip.MustParseAddrPort("10.0.0.1:10250")})
	for name, in := range map[string][]byte{
		"connect kind":  connect,
		"kind 5":        {1, 5, 0, 1, 0},
		"long probe":    {1, 4, 1, 0},
		"short probe":   {1, 4, 0, 9, 0},
		"version 2":     {2, 2, 0, 1, 0},
		"bad delegate":  {1, 2, 0, 1, 0},
		"bad election":  {1, 3, 0, 1, 0},
		"short fixed":   {1, 3},
		"short body":    {1, 3, 0, 9, 1},
		"empty request": {},
	} {
		if r, err := ReadEdgeRequest(bytes.NewReader(in)); err == nil {
			t.Errorf("%s: ReadEdgeRequest = %+v, want an error", name, r)
		}
	}
}

func TestElectionReplyRoundTrip(t *testing.T) {
	for _, r := range []ElectionReply{
		{Reply: Reply{Code: OK}, ConfigMap: []byte(recordJSON)},
		{Reply: Reply{Code: OK, Message: "created"}, ConfigMap: bytes.Repeat([]byte{'x'}, MaxConfigMapLen)},
		{Reply: Reply{Code: Conflict, Message: "the object has been modified"}},
		{Reply: Reply{Code: NotHolder, Message: strings.Repeat("m", 300)}},
	} {
		var buf bytes.Buffer
		if err := WriteElectionReply(&buf, r); err != nil {
			t.Fatalf("write %v: %v", r.Code, err)
		}
		if buf.Len() > MaxElectionReplyLen {
			t.Fatalf("reply of %d bytes, over MaxElectionReplyLen", buf.Len())
		}
		buf.WriteString("after")
		got, err := ReadElectionReply(&buf)
		var re *RefusedError
		switch {
		case r.Code == OK && err != nil:
			t.Fatalf("read OK reply: %v", err)
		case r.Code != OK && (!errors.As(err, &re) || re.Code != r.Code):
			t.Fatalf("read %v reply: %v, want a *RefusedError with that code", r.Code, err)
		}
		want := r
		if len(want.Message) > 255 {
			want.Message = want.Message[:255]
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("round trip (-sent +read):\n%s", diff)
		}
		if rest := buf.String(); rest != "after" {
			t.Errorf("ReadElectionReply read past the reply: left %q", rest)
		}
	}
}

func TestElectionReplyRejects(t *testing.T) {
	var buf bytes.Buffer
	for name, r := range map[string]ElectionReply{
		"OK without ConfigMap": {Reply: Reply{Code: OK}},
		"ConfigMap too large":  {Reply: Reply{Code: OK}, ConfigMap: make([]byte, MaxConfigMapLen+1)},
	} {
		if err := WriteElectionReply(&buf, r); !errors.Is(err, ErrBadHeader) || buf.Len() != 0 {
			t.Errorf("%s: err = %v with %d bytes written, want ErrBadHeader and nothing", name, err, buf.Len())
		}
	}
	for name, in := range map[string][]byte{
		"no length":      {1, 0, 0},
		"short length":   {1, 0, 0, 0},
		"zero length":    {1, 0, 0, 0, 0},
		"over the limit": {1, 0, 0, 0xff, 0xff},
		"short object":   {1, 0, 0, 0, 3, '{', '}'},
		"version 2":      {2, 0, 0, 0, 2, '{', '}'},
	} {
		if r, err := ReadElectionReply(bytes.NewReader(in)); err == nil {
			t.Errorf("%s: ReadElectionReply = %+v, want an error", name, r)
		}
	}
}

// FuzzReadElectionRequest: any bytes give an election request or an
// error, never a panic; ReadEdgeRequest reads the same bytes the same
// way; a request that parses re-encodes to one that parses the same,
// without reading past its end.
func FuzzReadElectionRequest(f *testing.F) {
	for _, r := range []ElectionRequest{
		{Op: ElectionCreate, Record: RecordElection, Pool: "shop", ConfigMap: []byte(recordJSON)},
		{Op: ElectionUpdate, Record: RecordSync, Pool: "p", ConfigMap: []byte{'{'}},
	} {
		b, _ := AppendElectionRequest(nil, r)
		f.Add(b)
	}
	d, _ := AppendDelegateRequest(nil, DelegateRequest{Node: "edge-2", Lease: []byte("{}")})
	f.Add(d)
	f.Add([]byte{1, 3, 0xff, 0xff, 1, 1, 1, 'p'})
	f.Add([]byte{1, 3, 0, 4, 1, 1, 5, 'a'})
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := ReadElectionRequest(bytes.NewReader(in))
		er, errE := ReadEdgeRequest(bytes.NewReader(in))
		if err != nil {
			if errE == nil && er.Election != nil {
				t.Fatalf("%q: ReadEdgeRequest reads an election request %+v, ReadElectionRequest: %v", in, er.Election, err)
			}
			return
		}
		if errE != nil || er.Election == nil || !cmp.Equal(*er.Election, r) {
			t.Fatalf("%q: ReadEdgeRequest %+v, %v; ReadElectionRequest %+v", in, er, errE, r)
		}
		if len(r.ConfigMap) > MaxConfigMapLen || len(r.Pool) > 63 {
			t.Fatalf("request with a pool of %d and a ConfigMap of %d bytes accepted", len(r.Pool), len(r.ConfigMap))
		}
		b, err := AppendElectionRequest(nil, r)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", r, err)
		}
		rd := bytes.NewReader(append(b, "after"...))
		r2, err := ReadElectionRequest(rd)
		if err != nil || !cmp.Equal(r2, r) || rd.Len() != len("after") {
			t.Fatalf("re-decode: %+v, %v, %d bytes left; want %+v", r2, err, rd.Len(), r)
		}
	})
}

// FuzzReadElectionReply: any bytes give a reply or an error, never a
// panic; an OK reply carries a ConfigMap within the bound and re-encodes
// to the same bytes it was read from.
func FuzzReadElectionReply(f *testing.F) {
	var buf bytes.Buffer
	WriteElectionReply(&buf, ElectionReply{Reply: Reply{Code: OK}, ConfigMap: []byte(recordJSON)})
	f.Add(buf.Bytes())
	f.Add([]byte{1, 13, 3, 'a', 'b', 'c'})
	f.Add([]byte{1, 0, 0, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		rd := bytes.NewReader(in)
		r, err := ReadElectionReply(rd)
		if err != nil {
			if r.Code == OK && len(r.ConfigMap) > 0 {
				t.Fatalf("error %v with a ConfigMap", err)
			}
			return
		}
		if r.Code != OK || len(r.ConfigMap) == 0 || len(r.ConfigMap) > MaxConfigMapLen {
			t.Fatalf("reply %v with %d bytes of ConfigMap and no error", r.Code, len(r.ConfigMap))
		}
		var out bytes.Buffer
		if err := WriteElectionReply(&out, r); err != nil || !bytes.Equal(out.Bytes(), in[:len(in)-rd.Len()]) {
			t.Fatalf("re-encode: %q, %v; read from %q", out.Bytes(), err, in[:len(in)-rd.Len()])
		}
	})
}

// The ops and record kinds are named in logs and metric labels; a value
// without a name says which it is.
func TestElectionNames(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{ElectionCreate.String(), "create"},
		{ElectionUpdate.String(), "update"},
		{ElectionOp(0).String(), "op_0"},
		{ElectionOp(9).String(), "op_9"},
		{RecordElection.String(), "election"},
		{RecordSync.String(), "sync"},
		{RecordKind(0).String(), "record_0"},
		{RecordKind(200).String(), "record_200"},
	} {
		if tc.got != tc.want {
			t.Errorf("%q, want %q", tc.got, tc.want)
		}
	}
}
