package dns

import (
	"net"
	"syscall"
)

// growReadBuffer asks for a UDP receive buffer of n bytes, beyond
// net.core.rmem_max when the process may (CAP_NET_ADMIN), so that a burst
// of queries is queued rather than dropped.
func growReadBuffer(c *net.UDPConn, n int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, n)
	}); err != nil {
		return err
	}
	if serr != nil {
		return c.SetReadBuffer(n) // capped at net.core.rmem_max
	}
	return nil
}
