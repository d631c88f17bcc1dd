package vip

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"

	"github.com/tether-edge/tether/netrules"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// LinkName is the dummy interface that holds the VIPs.
const LinkName = "tether0"

// Link is the dummy interface holding the VIPs, in the network namespace
// of the calling thread (as for netrules.Rules). The zero value manages
// LinkName.
type Link struct {
	// Name overrides LinkName.
	Name string
}

func (l Link) name() string {
	if l.Name != "" {
		return l.Name
	}
	return LinkName
}

// Sync makes the interface exist, as a dummy (an ifb on kernels without
// dummy interfaces), up, holding exactly addrs
// (each as a /32 or /128, IPv6 without duplicate address detection).
// Addresses it holds that are not in addrs are removed, except IPv6
// link-local ones, which the kernel manages. A link of that name that is
// not a dummy (or ifb) is an error wrapping netrules.ErrConflict.
func (l Link) Sync(addrs []netip.Addr) error {
	link, err := l.ensure()
	if err != nil {
		return err
	}
	want := make(map[netip.Prefix]bool, len(addrs))
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() {
			return fmt.Errorf("vip: %s: invalid address", l.name())
		}
		want[netip.PrefixFrom(a, a.BitLen())] = true
	}
	have, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return wrap("list addresses of "+l.name(), err)
	}
	for _, h := range have {
		p, ok := prefixOf(h.IPNet)
		if !ok || p.Addr().IsLinkLocalUnicast() {
			continue
		}
		if want[p] {
			delete(want, p)
			continue
		}
		if err := netlink.AddrDel(link, &h); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return wrap(fmt.Sprintf("remove %v from %s", p, l.name()), err)
		}
	}
	for p := range want {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, syscall.EEXIST) {
			return wrap(fmt.Sprintf("add %v to %s", p, l.name()), err)
		}
	}
	return nil
}

// ensure returns the dummy link, making it and setting it up as needed.
func (l Link) ensure() (netlink.Link, error) {
	link, err := netlink.LinkByName(l.name())
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		attrs := netlink.LinkAttrs{Name: l.name()}
		err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: attrs})
		if errors.Is(err, syscall.EOPNOTSUPP) {
			// A kernel built without CONFIG_DUMMY: an ifb interface
			// holds local addresses the same way.
			err = netlink.LinkAdd(&netlink.Ifb{LinkAttrs: attrs})
		}
		if errors.Is(err, syscall.EOPNOTSUPP) {
			return nil, fmt.Errorf("vip: create interface %s: %w: the kernel has neither dummy nor ifb interfaces", l.name(), netrules.ErrUnsupported)
		}
		if err != nil {
			return nil, wrap("create dummy interface "+l.name(), err)
		}
		if link, err = netlink.LinkByName(l.name()); err != nil {
			return nil, wrap("find "+l.name(), err)
		}
	case err != nil:
		return nil, wrap("find "+l.name(), err)
	case !ours(link):
		return nil, fmt.Errorf("vip: interface %s is a %s, not Tether's dummy: %w", l.name(), link.Type(), netrules.ErrConflict)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return nil, wrap("set "+l.name()+" up", err)
		}
	}
	return link, nil
}

// Delete removes the interface, and with it its addresses. It does
// nothing if there is none, and leaves alone a link of that name that is
// not a dummy.
func (l Link) Delete() error {
	link, err := netlink.LinkByName(l.name())
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		return nil
	case err != nil:
		return wrap("find "+l.name(), err)
	case !ours(link):
		return fmt.Errorf("vip: interface %s is a %s, not Tether's dummy: %w", l.name(), link.Type(), netrules.ErrConflict)
	}
	if err := netlink.LinkDel(link); err != nil {
		return wrap("delete "+l.name(), err)
	}
	return nil
}

// Addrs returns the VIPs the interface holds (not its link-local
// addresses), or none if it does not exist.
func (l Link) Addrs() ([]netip.Addr, error) {
	link, err := netlink.LinkByName(l.name())
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil, nil
	}
	if err != nil {
		return nil, wrap("find "+l.name(), err)
	}
	have, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, wrap("list addresses of "+l.name(), err)
	}
	var out []netip.Addr
	for _, h := range have {
		if p, ok := prefixOf(h.IPNet); ok && !p.Addr().IsLinkLocalUnicast() {
			out = append(out, p.Addr())
		}
	}
	return out, nil
}

// ours reports whether link is of a kind Link makes.
func ours(link netlink.Link) bool {
	return link.Type() == "dummy" || link.Type() == "ifb"
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

// wrap adds what was being done, and netrules.ErrPermission for EPERM.
func wrap(doing string, err error) error {
	if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EPERM) {
		return fmt.Errorf("vip: %s: %w (%v)", doing, netrules.ErrPermission, err)
	}
	return fmt.Errorf("vip: %s: %w", doing, err)
}
