package testenv

import (
	"io"
	"net"
	"net/netip"
)

// EchoServer starts a TCP echo server on loopback until the test ends and
// returns its address: each connection gets back what it sends, and its
// end (a half-close) once the client ends its side.
func EchoServer(t T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("echo server: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// GotServer starts a TCP server on loopback until the test ends and
// returns its address: it reads each connection until the client ends
// its side, then answers "got " and what it read, and closes.
func GotServer(t T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("got server: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				in, err := io.ReadAll(c)
				if err != nil {
					return
				}
				c.Write(append([]byte("got "), in...))
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}
