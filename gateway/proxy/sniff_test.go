package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"
)

// recorder keeps what a client wrote.
type recorder struct {
	net.Conn
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	r.buf.Write(b)
	r.mu.Unlock()
	return r.Conn.Write(b)
}

func (r *recorder) written() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.buf.Bytes())
}

// sniffPipe runs client on one end of a net.Pipe and sniffs the other end
// with a buffer of size bytes and a deadline of d. It returns what sniff
// returned and checks that every byte the client wrote so far is still
// buffered, unconsumed, in order.
func sniffPipe(t *testing.T, size int, d time.Duration, client func(net.Conn)) (name, by string, err error) {
	t.Helper()
	cc, sc := net.Pipe()
	rec := &recorder{Conn: cc}
	done := make(chan struct{})
	go func() {
		defer close(done)
		client(rec)
	}()
	t.Cleanup(func() {
		cc.Close()
		sc.Close()
		<-done
	})
	sc.SetReadDeadline(time.Now().Add(d))
	br := bufio.NewReaderSize(sc, size)
	name, by, err = sniff(br)
	if err == nil {
		buffered, _ := br.Peek(br.Buffered())
		if w := rec.written(); !bytes.HasPrefix(w, buffered) || len(buffered) == 0 {
			t.Errorf("buffered bytes (%d) are not what the client wrote (%d)", len(buffered), len(w))
		}
		// The relay reads the same bytes back through the connection.
		got := make([]byte, br.Buffered())
		if _, err := io.ReadFull(&peekedConn{r: br}, got); err != nil || !bytes.HasPrefix(rec.written(), got) {
			t.Errorf("relay would read %d bytes that differ from the client's: %v", len(got), err)
		}
	}
	return name, by, err
}

func tlsClient(serverName string) func(net.Conn) {
	return func(c net.Conn) {
		tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == ""}).Handshake()
	}
}

func TestSniffTLSServerName(t *testing.T) {
	name, by, err := sniffPipe(t, DefaultMaxPeek, 5*time.Second, tlsClient("Edge-1.Tether.Internal"))
	if err != nil || name != "Edge-1.Tether.Internal" || by != byTLS {
		t.Fatalf("sniff = %q, %q, %v; want the ClientHello's server name", name, by, err)
	}
}

func TestSniffTLSWithoutServerName(t *testing.T) {
	_, _, err := sniffPipe(t, DefaultMaxPeek, 5*time.Second, tlsClient(""))
	if !errors.Is(err, errNoName) {
		t.Fatalf("sniff err = %v, want errNoName", err)
	}
}

func TestSniffHTTPHost(t *testing.T) {
	name, by, err := sniffPipe(t, DefaultMaxPeek, 5*time.Second, func(c net.Conn) {
		req, _ := http.NewRequest("GET", "http://edge-1:10255/stats/summary", nil)
		req.Header.Set("User-Agent", "metrics-server")
		req.Write(c)
	})
	if err != nil || name != "edge-1" || by != byHTTP {
		t.Fatalf("sniff = %q, %q, %v; want Host edge-1", name, by, err)
	}
}

func TestSniffHTTPHostIPv6Literal(t *testing.T) {
	name, _, err := sniffPipe(t, DefaultMaxPeek, 5*time.Second, func(c net.Conn) {
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: [fd00::1]:10255\r\n\r\n")
	})
	if err != nil || name != "fd00::1" {
		t.Fatalf("sniff = %q, %v; want fd00::1", name, err)
	}
}

func TestSniffFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		size   int
		client func(net.Conn)
		want   error
	}{
		{"not TLS or HTTP", 0, func(c net.Conn) { c.Write([]byte("\x00\x01binary")) }, errNoName},
		{"HTTP without Host", 0, func(c net.Conn) { io.WriteString(c, "GET / HTTP/1.0\r\n\r\n") }, errNoName},
		{"HTTP Host with a port only", 0, func(c net.Conn) { io.WriteString(c, "GET / HTTP/1.1\r\nHost: :10250\r\n\r\n") }, errNoName},
		{"HTTP Host with empty brackets", 0, func(c net.Conn) { io.WriteString(c, "GET / HTTP/1.1\r\nHost: []:10250\r\n\r\n") }, errNoName},
		{"HTTP head too large", 256, func(c net.Conn) {
			io.WriteString(c, "GET / HTTP/1.1\r\nX-Padding: "+string(bytes.Repeat([]byte("a"), 512))+"\r\nHost: edge-1\r\n\r\n")
		}, errTooLarge},
		{"ClientHello too large", 64, tlsClient("edge-1"), errTooLarge},
		// Slowloris: a request head or a ClientHello that never completes.
		{"HTTP head stalls", 0, func(c net.Conn) { io.WriteString(c, "GET / HTTP/1.1\r\nHost: edge-1\r\n") }, os.ErrDeadlineExceeded},
		{"ClientHello stalls", 0, func(c net.Conn) { c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01}) }, os.ErrDeadlineExceeded},
		{"silent client", 0, func(net.Conn) {}, os.ErrDeadlineExceeded},
		{"client hangs up", 0, func(c net.Conn) { c.Write([]byte("GET")); c.Close() }, io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size := tc.size
			if size == 0 {
				size = DefaultMaxPeek
			}
			_, _, err := sniffPipe(t, size, 100*time.Millisecond, tc.client)
			if !errors.Is(err, tc.want) {
				t.Fatalf("sniff err = %v, want %v", err, tc.want)
			}
		})
	}
}
