package testenv

import (
	"crypto/tls"
	"net"
	"time"
)

// ClientHello is the first flight of a TLS client asking for serverName,
// as bytes a test can write to a connection itself (so that it alone reads
// what comes back).
func ClientHello(t T, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	go tls.Client(c, &tls.Config{ServerName: serverName}).Handshake()
	buf := make([]byte, 16<<10)
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := s.Read(buf)
	if err != nil {
		t.Fatalf("testenv: read the ClientHello: %v", err)
	}
	return buf[:n]
}
