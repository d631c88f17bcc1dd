//go:build !linux

package tunnelserver

import (
	"errors"
	"net"
)

var errNotLinux = errors.New("only on Linux")

func setUDPBuffers(uc *net.UDPConn, size int) (rcv, snd int, forced bool, err error) {
	return 0, 0, false, errNotLinux
}

func udpDrops(uc *net.UDPConn) (uint32, error) { return 0, errNotLinux }
