package dns

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/tether-edge/tether/gateway/nodewatch"
)

// table is everything the server answers, built from one Snapshot and
// never modified after it is published: the lookup path reads it without
// locks. Every name the server owns is a key of names, lower case and fully
// qualified: zone apexes, node names (bare and under each zone), the empty
// non-terminals between a zone and its deeper node names, and the reverse
// names of VIPs.
type table struct {
	names map[string]*entry
	zones []*zone // longest first
}

// entry holds the prebuilt records of one owner name. Their owner is the
// lower-case key; answers to a query spelt differently are copied.
type entry struct {
	a, aaaa, ptr []dns.RR
	zone         *zone // the zone the name is in, nil for bare names
	apex         bool
}

type zone struct {
	name    string
	soa, ns []dns.RR
}

// record is one node name with the addresses it answers, in the order
// they are answered. The DNS table and the hosts ConfigMap are built from
// the same records.
type record struct {
	node  string
	addrs []netip.Addr
	ptr   bool // the addresses are VIPs: answer PTR queries for them
}

// records returns the names to serve from snap, sorted by node name: edge
// nodes with the addresses the snapshot routes to them (in mode; never an
// address it refuses, such as one two edges claim), cloud nodes with their
// own addresses when cloud is set. Nodes without an address are left out.
func records(snap *nodewatch.Snapshot, mode nodewatch.Mode, cloud bool) []record {
	routes := snap.Routing(mode)
	rs := make([]record, 0, len(snap.Nodes))
	for _, n := range snap.Nodes {
		if !n.Edge && !cloud {
			continue
		}
		addrs := n.Reach(mode)
		if n.Edge {
			addrs = routes.Of(n.Name)
		}
		if len(addrs) == 0 {
			continue
		}
		rs = append(rs, record{node: n.Name, addrs: addrs, ptr: n.Edge && mode == nodewatch.ModeVIP})
	}
	slices.SortFunc(rs, func(a, b record) int { return cmp.Compare(a.node, b.node) })
	return rs
}

// buildTable renders snap for the given options.
func buildTable(snap *nodewatch.Snapshot, o *Options) *table {
	rs := records(snap, o.Mode, o.CloudNodes)
	t := &table{names: make(map[string]*entry, len(rs)*(1+len(o.Zones))+4*len(o.Zones))}
	ttl := uint32(o.TTL / time.Second)
	serial := uint32(time.Now().Unix())
	for _, zn := range o.Zones {
		z := &zone{name: zn}
		nsName := "ns.dns." + zn
		z.soa = []dns.RR{&dns.SOA{
			Hdr:     hdr(zn, dns.TypeSOA, ttl),
			Ns:      nsName,
			Mbox:    "hostmaster." + zn,
			Serial:  serial,
			Refresh: 7200,
			Retry:   1800,
			Expire:  86400,
			Minttl:  ttl,
		}}
		z.ns = []dns.RR{&dns.NS{Hdr: hdr(zn, dns.TypeNS, ttl), Ns: nsName}}
		t.zones = append(t.zones, z)
	}
	slices.SortFunc(t.zones, func(a, b *zone) int { return cmp.Compare(len(b.name), len(a.name)) })
	for _, z := range t.zones {
		e := t.entry(z.name)
		e.apex = true
		t.addAddrs("ns.dns."+z.name, o.NSAddrs, ttl)
	}
	for _, r := range rs {
		name := strings.ToLower(r.node) + "."
		t.addAddrs(name, r.addrs, ttl)
		for _, z := range t.zones {
			t.addAddrs(name+z.name, r.addrs, ttl)
		}
		if !r.ptr {
			continue
		}
		target := name
		if len(o.Zones) > 0 {
			target = name + o.Zones[0]
		}
		for _, a := range r.addrs {
			rev := reverseName(a)
			e := t.entry(rev)
			e.ptr = append(e.ptr, &dns.PTR{Hdr: hdr(rev, dns.TypePTR, ttl), Ptr: target})
		}
	}
	return t
}

// addAddrs adds A and AAAA records for addrs to name.
func (t *table) addAddrs(name string, addrs []netip.Addr, ttl uint32) {
	if len(addrs) == 0 {
		return
	}
	e := t.entry(name)
	for _, a := range addrs {
		if a.Is4() {
			e.a = append(e.a, &dns.A{Hdr: hdr(name, dns.TypeA, ttl), A: a.AsSlice()})
		} else {
			e.aaaa = append(e.aaaa, &dns.AAAA{Hdr: hdr(name, dns.TypeAAAA, ttl), AAAA: a.AsSlice()})
		}
	}
}

// entry returns the entry for name, creating it and the empty
// non-terminals between it and its zone.
func (t *table) entry(name string) *entry {
	if e := t.names[name]; e != nil {
		return e
	}
	e := &entry{zone: t.zoneOf(name)}
	t.names[name] = e
	if e.zone != nil && name != e.zone.name {
		if _, parent, ok := strings.Cut(name, "."); ok && parent != "" {
			t.entry(parent)
		}
	}
	return e
}

// zoneOf returns the most specific zone that contains name, or nil.
func (t *table) zoneOf(name string) *zone {
	for _, z := range t.zones {
		if inZone(name, z.name) {
			return z
		}
	}
	return nil
}

// inZone reports whether name is zone or below it; both are lower case
// and fully qualified.
func inZone(name, zone string) bool {
	if zone == "." {
		return true
	}
	if !strings.HasSuffix(name, zone) {
		return false
	}
	i := len(name) - len(zone)
	return i == 0 || name[i-1] == '.'
}

func hdr(name string, typ uint16, ttl uint32) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: typ, Class: dns.ClassINET, Ttl: ttl}
}

// reverseName returns the in-addr.arpa or ip6.arpa name of a.
func reverseName(a netip.Addr) string {
	s, _ := dns.ReverseAddr(a.String()) // cannot fail for a valid address
	return s
}
