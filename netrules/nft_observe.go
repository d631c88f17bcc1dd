package netrules

// Reading table inet tether back: ownership (ErrConflict) and drift.

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
)

// nftObserved is what the kernel holds in table inet tether.
type nftObserved struct {
	exists bool
	chains map[string]*nftables.Chain
	rules  map[string][]*nftables.Rule
	sets   map[string]*nftables.Set
	elems  map[string][][]byte
}

// nftObserve reads table inet tether: its chains, rules, sets and, if
// withElements, the sets' elements.
func nftObserve(c *nftables.Conn, withElements bool) (*nftObserved, error) {
	obs := &nftObserved{
		chains: map[string]*nftables.Chain{},
		rules:  map[string][]*nftables.Rule{},
		sets:   map[string]*nftables.Set{},
		elems:  map[string][][]byte{},
	}
	tables, err := nftListTables(c)
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		obs.exists = obs.exists || t.Name == nftTableName
	}
	if !obs.exists {
		return obs, nil
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, classify("nftables: list chains", err)
	}
	for _, ch := range chains {
		if ch.Table.Name != nftTableName {
			continue
		}
		obs.chains[ch.Name] = ch
		rules, err := c.GetRules(nftTable, ch)
		if err != nil {
			return nil, classify("nftables: list rules of chain "+ch.Name, err)
		}
		obs.rules[ch.Name] = rules
	}
	sets, err := c.GetSets(nftTable)
	if err != nil {
		return nil, classify("nftables: list sets", err)
	}
	for _, s := range sets {
		obs.sets[s.Name] = s
		if !withElements {
			continue
		}
		keys, err := setKeys(c, s)
		if err != nil {
			return nil, err
		}
		obs.elems[s.Name] = keys
	}
	return obs, nil
}

// owned reports whether the table is Tether's: every chain and set in it
// has one of Tether's names and every rule carries Tether's comment. (The
// library does not read set comments back, so rules carry the marker; a
// table someone flushed still counts as Tether's.)
func (o *nftObserved) owned() bool {
	for name := range o.chains {
		if !slices.ContainsFunc(nftChains, func(c nftChainSpec) bool { return c.name == name }) {
			return false
		}
	}
	for name := range o.sets {
		if !slices.ContainsFunc(nftSets, func(s nftSetSpec) bool { return s.name == name }) {
			return false
		}
	}
	for _, rules := range o.rules {
		for _, r := range rules {
			c, ok := userdata.GetString(r.UserData, userdata.TypeComment)
			if !ok || !strings.HasPrefix(c, marker) {
				return false
			}
		}
	}
	return true
}

// drift describes how the table differs from what st renders to; "" if
// it does not. Set elements are compared only if withElements (and were
// read).
func (o *nftObserved) drift(st *state, withElements bool) string {
	if !o.exists {
		return "table missing"
	}
	if len(o.chains) != len(nftChains) || len(o.sets) != len(nftSets) {
		return fmt.Sprintf("%d chains and %d sets, want %d and %d", len(o.chains), len(o.sets), len(nftChains), len(nftSets))
	}
	for _, spec := range nftChains {
		ch, ok := o.chains[spec.name]
		if !ok || ch.Type != nftables.ChainTypeNAT || ch.Hooknum == nil || *ch.Hooknum != *spec.hook ||
			ch.Priority == nil || *ch.Priority != spec.priority || ch.Policy == nil || *ch.Policy != nftables.ChainPolicyAccept {
			return "chain " + spec.name + " missing or changed"
		}
		rules := o.rules[spec.name]
		if len(rules) != len(nftRuleSpecs) {
			return fmt.Sprintf("chain %s has %d rules, want %d", spec.name, len(rules), len(nftRuleSpecs))
		}
		for i, rs := range nftRuleSpecs {
			if !sameExprs(rules[i].Exprs, rs.exprs(st.proxyPort)) || !bytes.Equal(rules[i].UserData, rs.userData()) {
				return fmt.Sprintf("chain %s rule %d changed", spec.name, i)
			}
		}
	}
	for _, spec := range nftSets {
		s, ok := o.sets[spec.name]
		if !ok || s.KeyType.Name != spec.keyType.Name || s.IsMap || s.Interval != spec.interval || s.HasTimeout {
			return "set " + spec.name + " missing or changed"
		}
		if !withElements {
			continue
		}
		added, removed := diffKeys(o.elems[spec.name], spec.elements(st))
		if len(added)+len(removed) > 0 {
			return fmt.Sprintf("set %s: %d elements missing, %d extra", spec.name, len(added), len(removed))
		}
	}
	return ""
}

// sameExprs compares rule expressions by their netlink encoding. The set
// IDs of lookups are batch-local, so they are left out.
func sameExprs(got, want []expr.Any) bool {
	if len(got) != len(want) {
		return false
	}
	enc := func(e expr.Any) []byte {
		if l, ok := e.(*expr.Lookup); ok {
			c := *l
			c.SetID = 0
			e = &c
		}
		b, err := expr.Marshal(byte(nftables.TableFamilyINet), e)
		if err != nil {
			return nil
		}
		return b
	}
	for i := range got {
		g, w := enc(got[i]), enc(want[i])
		if g == nil || !bytes.Equal(g, w) {
			return false
		}
	}
	return true
}

// setKeys lists the elements of set s as the diff compares them: their
// keys, and for an interval set the key then a flag byte, as rangeKeys
// spells them.
func setKeys(c *nftables.Conn, s *nftables.Set) ([][]byte, error) {
	elems, err := c.GetSetElements(s)
	if err != nil {
		return nil, classify("nftables: list elements of set "+s.Name, err)
	}
	keys := make([][]byte, len(elems))
	for i, e := range elems {
		keys[i] = e.Key
		if s.Interval {
			flag := rangeStart
			if e.IntervalEnd {
				flag = rangeEnd
			}
			keys[i] = append(slices.Clip(e.Key), flag)
		}
	}
	return keys, nil
}
