package netrules

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// OriginalDst returns the destination a redirected connection had before
// the rules rewrote it, from the connection tracking entry
// (SO_ORIGINAL_DST for IPv4, IP6T_SO_ORIGINAL_DST for IPv6). It works on
// connections accepted by IPv4, IPv6 and dual-stack listeners; IPv4
// connections on a dual-stack listener are asked as IPv4. For a connection
// that was not redirected it returns the connection's own local address;
// an error means the kernel has no conntrack entry for it.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	local, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("original destination: local address %v is not TCP", c.LocalAddr())
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	v4 := local.AddrPort().Addr().Unmap().Is4()
	var dst netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		if v4 {
			dst, serr = origDst4(int(fd))
		} else {
			dst, serr = origDst6(int(fd))
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination of %v: %w", c.RemoteAddr(), err)
	}
	return dst, nil
}

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h),
// which x/sys/unix does not define; it has SO_ORIGINAL_DST's value, at level
// SOL_IPV6.
const ip6tSOOriginalDst = 80

func origDst4(fd int) (netip.AddrPort, error) {
	var sa unix.RawSockaddrInet4
	if err := getsockopt(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), unsafe.Sizeof(sa)); err != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockopt SO_ORIGINAL_DST: %w", err)
	}
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port(sa.Port)), nil
}

func origDst6(fd int) (netip.AddrPort, error) {
	var sa unix.RawSockaddrInet6
	if err := getsockopt(fd, unix.SOL_IPV6, ip6tSOOriginalDst, unsafe.Pointer(&sa), unsafe.Sizeof(sa)); err != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockopt IP6T_SO_ORIGINAL_DST: %w", err)
	}
	return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), port(sa.Port)), nil
}

// port converts a port as stored in a sockaddr (network byte order).
func port(p uint16) uint16 {
	var b [2]byte
	*(*uint16)(unsafe.Pointer(&b[0])) = p
	return binary.BigEndian.Uint16(b[:])
}

func getsockopt(fd, level, opt int, p unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}
