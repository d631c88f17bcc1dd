//go:build !linux

package dns

import "net"

// growReadBuffer asks for a UDP receive buffer of n bytes.
func growReadBuffer(c *net.UDPConn, n int) error { return c.SetReadBuffer(n) }
