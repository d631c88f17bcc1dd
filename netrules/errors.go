package netrules

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// Errors callers branch on (with errors.Is). The errors Apply, Cleanup and
// New return wrap one of them when it applies, with what was being done.
var (
	// ErrUnsupported: the kernel or the host lacks what the backend needs
	// (nf_tables, the nat table, the iptables commands).
	ErrUnsupported = errors.New("not supported by this host")
	// ErrPermission: the process may not change the packet filter. The
	// gateway needs CAP_NET_ADMIN in the host's network namespace.
	ErrPermission = errors.New("permission denied: tether-gateway needs CAP_NET_ADMIN")
	// ErrConflict: an object with the name Tether uses (table inet tether,
	// chains TETHER-*) exists and was not made by Tether. Tether leaves it
	// alone; rename or remove it.
	ErrConflict = errors.New("name in use by something that is not Tether")
)

// classify wraps err with the sentinel its errno stands for, if any, and
// with what was being done.
func classify(doing string, err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, ErrPermission), errors.Is(err, ErrUnsupported), errors.Is(err, ErrConflict):
		return fmt.Errorf("%s: %w", doing, err)
	case errors.Is(err, os.ErrPermission), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return fmt.Errorf("%s: %w (%v)", doing, ErrPermission, err)
	case errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.EPROTONOSUPPORT),
		errors.Is(err, syscall.EAFNOSUPPORT):
		return fmt.Errorf("%s: %w (%v)", doing, ErrUnsupported, err)
	}
	return fmt.Errorf("%s: %w", doing, err)
}
