package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Sniffing: for a connection addressed to the gateway itself, the name the
// client wants is read from the first bytes it sends — the server name of a
// TLS ClientHello, or the Host header of an HTTP/1 request — without
// consuming them: they stay in a bufio.Reader and are relayed to the edge
// first. TLS is never terminated. The caller bounds the time (a read
// deadline on the connection); the bufio.Reader's size bounds the bytes.

// Ways a name was found.
const (
	byTLS  = "sni"
	byHTTP = "host"
)

var (
	// errNoName: the client's first bytes carry no name (not TLS or HTTP/1,
	// or TLS without a server name).
	errNoName = errors.New("no TLS server name or HTTP Host in the first bytes")
	// errTooLarge: no complete ClientHello or request head fit in the
	// buffer.
	errTooLarge = errors.New("ClientHello or HTTP request head larger than the peek buffer")
)

const recordTypeHandshake = 0x16

// sniff returns the name the client asks for and how it was found. It
// reads from br only through Peek, so every byte stays buffered.
func sniff(br *bufio.Reader) (name, by string, err error) {
	first, err := br.Peek(1)
	if err != nil {
		return "", "", err
	}
	switch c := first[0]; {
	case c == recordTypeHandshake:
		name, err = serverName(br)
		return name, byTLS, err
	case 'A' <= c && c <= 'Z': // an HTTP method
		name, err = httpHost(br)
		return name, byHTTP, err
	}
	return "", "", errNoName
}

// errHelloRead stops crypto/tls once it has parsed the ClientHello.
var errHelloRead = errors.New("client hello read")

// serverName lets crypto/tls parse the ClientHello (records may be
// fragmented; the parser knows every rule) and stops the handshake as soon
// as the hello is parsed, before anything is written to the client.
func serverName(br *bufio.Reader) (string, error) {
	var sni string
	var seen bool
	pc := &peekConn{r: &peekReader{br: br}}
	err := tls.Server(pc, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, seen = h.ServerName, true
			return nil, errHelloRead
		},
	}).Handshake()
	switch {
	case seen && sni == "":
		return "", errNoName
	case seen:
		return sni, nil
	case errors.Is(pc.r.err, bufio.ErrBufferFull):
		return "", errTooLarge
	case pc.r.err != nil:
		return "", pc.r.err // the read error (a deadline, EOF) rather than TLS's
	}
	return "", fmt.Errorf("parse ClientHello: %w", err)
}

// httpHost returns the Host of the HTTP/1 request head at the start of br.
func httpHost(br *bufio.Reader) (string, error) {
	for {
		buf, _ := br.Peek(br.Buffered())
		if i := bytes.Index(buf, []byte("\r\n\r\n")); i >= 0 {
			req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(buf[:i+4])))
			if err != nil {
				return "", fmt.Errorf("parse HTTP request head: %w", err)
			}
			if req.Host == "" {
				return "", errNoName
			}
			// Go's server refuses such a request (a folded header line
			// makes "Host: a\r\n b" the Host "a b"); so does the sniffer.
			if strings.ContainsFunc(req.Host, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
				return "", fmt.Errorf("invalid HTTP Host %q", req.Host)
			}
			host := req.Host
			if h, _, err := net.SplitHostPort(host); err == nil {
				host = h
			}
			if host == "" { // "Host: :80" or "Host: []:80" names nothing
				return "", errNoName
			}
			return host, nil
		}
		if br.Buffered() == br.Size() {
			return "", errTooLarge
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return "", err
		}
	}
}

// peekReader reads br through Peek, leaving its bytes buffered.
type peekReader struct {
	br  *bufio.Reader
	off int
	err error // the first error from br
}

func (p *peekReader) Read(b []byte) (int, error) {
	if p.err != nil {
		return 0, p.err
	}
	if p.off == p.br.Buffered() {
		if _, err := p.br.Peek(p.off + 1); err != nil {
			p.err = err
			return 0, err
		}
	}
	n := min(len(b), p.br.Buffered()-p.off)
	buf, _ := p.br.Peek(p.off + n)
	copy(b, buf[p.off:])
	p.off += n
	return n, nil
}

// peekConn is the net.Conn crypto/tls reads the ClientHello from. Writes
// (the alert crypto/tls sends when the handshake is stopped) go nowhere.
type peekConn struct{ r *peekReader }

var _ net.Conn = (*peekConn)(nil)

func (c *peekConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *peekConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *peekConn) Close() error                     { return nil }
func (c *peekConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *peekConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *peekConn) SetDeadline(time.Time) error      { return nil }
func (c *peekConn) SetReadDeadline(time.Time) error  { return nil }
func (c *peekConn) SetWriteDeadline(time.Time) error { return nil }

// peekedConn is a client connection whose first bytes were sniffed: reads
// return the buffered bytes first, then the rest of the stream.
type peekedConn struct {
	tc *net.TCPConn
	r  io.Reader
}

func (c *peekedConn) Read(b []byte) (int, error)  { return c.r.Read(b) }
func (c *peekedConn) Write(b []byte) (int, error) { return c.tc.Write(b) }
func (c *peekedConn) Close() error                { return c.tc.Close() }
func (c *peekedConn) CloseWrite() error           { return c.tc.CloseWrite() }
func (c *peekedConn) SetLinger(sec int) error     { return c.tc.SetLinger(sec) }
