package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"testing"
)

// FuzzSniff feeds arbitrary first bytes of a client connection (from
// anyone in the VPC who reaches the transparent listener) to sniff. It
// must not panic, must never consume a byte (what it read stays buffered,
// in order, for the relay), never buffer more than its reader's size, and
// a name it returns must be non-empty and come from the input.
func FuzzSniff(f *testing.F) {
	for _, seed := range [][]byte{
		clientHelloFor(f, "edge-1.tether.internal"),
		clientHelloFor(f, ""),
		[]byte("GET /stats/summary HTTP/1.1\r\nHost: edge-1:10255\r\nUser-Agent: metrics-server\r\n\r\n"),
		[]byte("GET / HTTP/1.1\r\nHost: [fd00::1]:10255\r\n\r\n"),
		[]byte("GET / HTTP/1.0\r\n\r\n"),
		{0x16, 0x03, 0x01, 0x02, 0x00, 0x01},
		{0x16},
		[]byte("G"),
		{},
	} {
		f.Add(seed)
	}
	const size = 4096 // smaller than DefaultMaxPeek, so that inputs reach the limit
	f.Fuzz(func(t *testing.T, in []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(in), size)
		name, by, err := sniff(br)
		if br.Buffered() > size {
			t.Fatalf("buffered %d bytes, over the reader's %d", br.Buffered(), size)
		}
		buffered, _ := br.Peek(br.Buffered())
		if !bytes.HasPrefix(in, buffered) {
			t.Fatalf("the buffered bytes are not the input's first %d", len(buffered))
		}
		rest, _ := io.ReadAll(br)
		if !bytes.Equal(rest, in) {
			t.Fatalf("reading after sniff gives %d bytes, not the %d of the input", len(rest), len(in))
		}
		if err != nil {
			return
		}
		if name == "" || (by != byTLS && by != byHTTP) {
			t.Fatalf("sniff = %q, %q with no error", name, by)
		}
		if by == byHTTP && !bytes.Contains(bytes.ToLower(in), bytes.ToLower([]byte(name))) {
			t.Fatalf("Host %q is not in the input", name)
		}
	})
}

// clientHelloFor is the first flight of a TLS client asking for
// serverName, with X25519 only: a post-quantum key share would make it
// 1.5 KB, and the fuzzer's minimizing of such inputs eats the run.
func clientHelloFor(f *testing.F, serverName string) []byte {
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	go tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == "", CurvePreferences: []tls.CurveID{tls.X25519}}).Handshake()
	buf := make([]byte, 16<<10)
	n, err := s.Read(buf)
	if err != nil {
		f.Fatal(err)
	}
	return buf[:n]
}
