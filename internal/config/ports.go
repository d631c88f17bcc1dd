package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Ports is a list of TCP ports. As a flag it takes a comma-separated
// list ("10250,10255"); in the YAML file a list or such a string.
type Ports []uint16

func (p *Ports) String() string {
	if p == nil {
		return ""
	}
	s := make([]string, len(*p))
	for i, port := range *p {
		s[i] = strconv.Itoa(int(port))
	}
	return strings.Join(s, ",")
}

func (p *Ports) Set(v string) error {
	var out Ports
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("bad port %q", f)
		}
		out = append(out, uint16(n))
	}
	*p = out
	return nil
}

func (p *Ports) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		return p.Set(s)
	}
	var list []uint16
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("want a list of ports: %w", err)
	}
	for _, n := range list {
		if n == 0 {
			return errors.New("bad port 0")
		}
	}
	*p = list
	return nil
}
