package tunnelserver

import (
	"errors"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// setUDPBuffers sets the socket's receive and send buffers to size bytes:
// with SO_RCVBUFFORCE and SO_SNDBUFFORCE when the process may
// (CAP_NET_ADMIN), else with SO_RCVBUF and SO_SNDBUF, which the kernel
// caps at net.core.rmem_max and wmem_max. It returns the sizes the socket
// has then, as asked for (the kernel reports twice that, its bookkeeping
// included, and so do we not).
func setUDPBuffers(uc *net.UDPConn, size int) (rcv, snd int, forced bool, err error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return 0, 0, false, err
	}
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		forced = true
		for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], size) != nil {
				forced = false
				if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], size); err != nil {
					serr = errors.Join(serr, err)
				}
			}
		}
		var e1, e2 error
		rcv, e1 = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		snd, e2 = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		serr = errors.Join(serr, e1, e2)
	})
	return rcv / 2, snd / 2, forced, errors.Join(cerr, serr)
}

// udpDrops is the number of datagrams the kernel dropped on the socket
// (its sk_drops: for UDP, those that found the receive buffer full), from
// SO_MEMINFO.
func udpDrops(uc *net.UDPConn) (uint32, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var mem [unix.SK_MEMINFO_VARS]uint32
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		serr = getsockoptMeminfo(int(fd), &mem)
	})
	if err := errors.Join(cerr, serr); err != nil {
		return 0, err
	}
	return mem[unix.SK_MEMINFO_DROPS], nil
}

func getsockoptMeminfo(fd int, mem *[unix.SK_MEMINFO_VARS]uint32) error {
	l := uint32(len(mem) * 4)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}
