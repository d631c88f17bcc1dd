package netrules

// The nftables backend: table inet tether, written through netlink with
// github.com/google/nftables (no nft binary needed).

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

const (
	// elemsPerMsg bounds the elements in one netlink message: a message's
	// element list is one attribute, whose length field has 16 bits.
	elemsPerMsg = 1000
	// elementCheckEvery bounds how long element-level drift (an element
	// someone added to or deleted from our sets) can go unnoticed. Every
	// Apply checks the table, chains, rules and sets; it reads the sets'
	// elements back (10,000 cost about 10 ms) only when it has nothing to
	// change (the resync timer's Apply) or when this long has passed.
	elementCheckEvery = time.Minute
)

type nftRules struct {
	mu sync.Mutex
	tracker
	// elementsChecked is when the sets' elements were last written in
	// full or found to match last.
	elementsChecked time.Time
}

var _ Rules = (*nftRules)(nil)

func newNFTRules(log *slog.Logger) (*nftRules, error) {
	r := &nftRules{tracker: tracker{log: log.With("backend", KindNFTables), needFull: true}}
	c, err := nftConn(0)
	if err != nil {
		return nil, err
	}
	defer c.CloseLasting()
	if err := nftProbe(c); err != nil {
		return nil, err
	}
	return r, nil
}

func (*nftRules) Backend() string { return KindNFTables }

// nftConn opens a netlink socket in the calling thread's namespace, for
// all the requests of one call (close it with CloseLasting), with a send
// buffer that fits a batch of about n set elements.
func nftConn(n int) (*nftables.Conn, error) {
	size := 64*n + 1<<20
	c, err := nftables.New(nftables.AsLasting(), nftables.WithSockOptions(func(nc *netlink.Conn) error {
		rc, err := nc.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		err = rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, size)
		})
		if err == nil && serr != nil {
			// Without CAP_NET_ADMIN the batch fails anyway, with EPERM.
			return nc.SetWriteBuffer(size)
		}
		return err
	}))
	if err != nil {
		return nil, classify("nftables: open netlink socket", err)
	}
	return c, nil
}

// closeInBackground closes c without waiting. Closing an nf_tables netlink
// socket waits until the kernel has destroyed the transactions committed
// through it, which takes an RCU grace period (about 10 ms on our test
// machines, as long as the rest of a one-node Apply); the rules are in
// place as soon as the batch is acknowledged, so Apply need not wait.
func closeInBackground(c *nftables.Conn) {
	go func() { _ = c.CloseLasting() }()
}

// nftProbe checks that nf_tables answers, turning errors into ErrUnsupported
// or ErrPermission.
func nftProbe(c *nftables.Conn) error {
	_, err := nftListTables(c)
	return err
}

// nftListTables lists the inet tables.
func nftListTables(c *nftables.Conn) ([]*nftables.Table, error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
		// nfnetlink answers EINVAL for a subsystem it cannot load.
		return nil, fmt.Errorf("nftables: list tables: %w: the kernel has no nf_tables (%v)", ErrUnsupported, err)
	}
	if err != nil {
		return nil, classify("nftables: list tables", err)
	}
	return tables, nil
}

func (r *nftRules) Apply(ctx context.Context, d Desired) error {
	want, err := normalize(d)
	if err != nil {
		return err
	}
	want.logShadowed(r.log)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := r.apply(want); err != nil {
		r.failed()
		return err
	}
	r.succeeded(want)
	return nil
}

// FlushConntrack deletes the conntrack entries of what the Applies since
// the last flush stopped redirecting.
func (r *nftRules) FlushConntrack(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.flushConntrack()
}

func (r *nftRules) apply(want *state) error {
	n := len(want.v4) + len(want.v6) + len(want.ports) + 2*(len(want.pods4)+len(want.pods6))
	if r.last != nil {
		n += len(r.last.v4) + len(r.last.v6) + 2*(len(r.last.pods4)+len(r.last.pods6))
	}
	c, err := nftConn(n)
	if err != nil {
		return err
	}
	defer closeInBackground(c)
	full := r.needFull || r.last == nil || r.last.proxyPort != want.proxyPort
	checkElements := !full && (want.sameDestinations(r.last) || time.Since(r.elementsChecked) >= elementCheckEvery)
	obs, err := nftObserve(c, checkElements)
	if err != nil {
		return err
	}
	if !full {
		if why := obs.drift(r.last, checkElements); why != "" {
			r.log.Warn("netrules: table changed by someone else; rewriting it", "drift", why)
			full = true
		}
	}
	if full {
		if obs.exists && !obs.owned() {
			return fmt.Errorf("nftables: table inet %s: %w", nftTableName, ErrConflict)
		}
		if err := nftWriteFull(c, want); err != nil {
			return err
		}
	} else if err := nftWriteDelta(c, r.last, want); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return classify(fmt.Sprintf("nftables: write table inet %s", nftTableName), err)
	}
	if full || checkElements {
		r.elementsChecked = time.Now()
	}
	r.log.Debug("netrules: applied", "full", full, "ipv4", len(want.v4), "ipv6", len(want.v6), "ports", want.ports,
		"pod_ranges_ipv4", len(want.pods4), "pod_ranges_ipv6", len(want.pods6))
	return nil
}

// nftWriteFull queues the whole table: it deletes ours, if any, and makes
// it again, in one batch (the kernel applies a batch atomically).
func nftWriteFull(c *nftables.Conn, st *state) error {
	c.AddTable(nftTable) // so that the delete cannot fail if it is gone
	c.DelTable(nftTable)
	c.AddTable(nftTable)
	for _, s := range nftSets {
		set := s.set()
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("nftables: set %s: %w", s.name, err)
		}
		if err := nftElements(c.SetAddElements, s, set, s.elements(st)); err != nil {
			return err
		}
	}
	for _, ch := range nftChains {
		chain := c.AddChain(ch.chain())
		for _, rs := range nftRuleSpecs {
			c.AddRule(&nftables.Rule{Table: nftTable, Chain: chain, Exprs: rs.exprs(st.proxyPort), UserData: rs.userData()})
		}
	}
	return nil
}

// nftWriteDelta queues the set elements that differ between have and
// want. The interval sets are compared element by element (an interval's
// start and its end), so a range that comes or goes costs its two
// elements, or one next to an adjacent range; a batch removes before it
// adds, so the kernel never sees the old and the new ranges overlap.
func nftWriteDelta(c *nftables.Conn, have, want *state) error {
	add4, del4 := diffSorted(have.v4, want.v4, netip.Addr.Compare)
	add6, del6 := diffSorted(have.v6, want.v6, netip.Addr.Compare)
	addP, delP := diffSorted(have.ports, want.ports, cmp.Compare[uint16])
	addR4, delR4 := diffKeys(setPods4.elements(have), setPods4.elements(want))
	addR6, delR6 := diffKeys(setPods6.elements(have), setPods6.elements(want))
	for _, f := range []struct {
		spec           nftSetSpec
		added, removed [][]byte
	}{
		{setEdges4, addrKeys(add4, 4), addrKeys(del4, 4)},
		{setEdges6, addrKeys(add6, 16), addrKeys(del6, 16)},
		{setPorts, portKeys(addP), portKeys(delP)},
		{setPods4, addR4, delR4},
		{setPods6, addR6, delR6},
	} {
		set := f.spec.set()
		set.ID = 0 // the set exists; the kernel finds it by name
		if err := nftElements(c.SetDeleteElements, f.spec, set, f.removed); err != nil {
			return err
		}
		if err := nftElements(c.SetAddElements, f.spec, set, f.added); err != nil {
			return err
		}
	}
	return nil
}

// nftElements queues the elements of spec's set with keys to op,
// elemsPerMsg per message.
func nftElements(op func(*nftables.Set, []nftables.SetElement) error, spec nftSetSpec, set *nftables.Set, keys [][]byte) error {
	for chunk := range slices.Chunk(keys, elemsPerMsg) {
		elems := make([]nftables.SetElement, len(chunk))
		for i, k := range chunk {
			elems[i] = spec.setElement(k)
		}
		if err := op(set, elems); err != nil {
			return fmt.Errorf("nftables: set %s: %w", set.Name, err)
		}
	}
	return nil
}

// diffKeys returns the keys only in want and the keys only in have. Keys
// compare as big-endian numbers, the order elements renders them in; the
// kernel's (hash order) are sorted first.
func diffKeys(have, want [][]byte) (added, removed [][]byte) {
	for _, keys := range []*[][]byte{&have, &want} {
		if !slices.IsSortedFunc(*keys, bytes.Compare) {
			*keys = slices.Clone(*keys)
			slices.SortFunc(*keys, bytes.Compare)
		}
	}
	return diffSorted(have, want, bytes.Compare)
}

func (r *nftRules) Cleanup(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := nftConn(0)
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	obs, err := nftObserve(c, false)
	if err != nil {
		return err
	}
	if obs.exists {
		if !obs.owned() {
			return fmt.Errorf("nftables: remove table inet %s: %w", nftTableName, ErrConflict)
		}
		c.DelTable(nftTable)
		if err := c.Flush(); err != nil {
			r.failed()
			return classify(fmt.Sprintf("nftables: remove table inet %s", nftTableName), err)
		}
	}
	r.succeeded(nil)
	r.flushLogged()
	return nil
}
