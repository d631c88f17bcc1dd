package dns

import (
	"strings"

	"github.com/miekg/dns"
)

// respond builds into resp the response to req. opt is the OPT record the
// response carries when req has one; the caller owns it because packing
// writes into it. respond reports false when req gets no answer at all
// (it is itself a response), and otherwise the largest UDP response the
// client accepts.
func (s *Server) respond(req, resp *dns.Msg, opt *dns.OPT) (ok bool, udpLimit int) {
	if req.Response {
		return false, 0
	}
	resp.MsgHdr = dns.MsgHdr{
		Id:               req.Id,
		Response:         true,
		Opcode:           req.Opcode,
		RecursionDesired: req.RecursionDesired,
		CheckingDisabled: req.CheckingDisabled,
	}
	resp.Compress = false
	resp.Question = resp.Question[:0]
	resp.Answer = resp.Answer[:0]
	resp.Ns = resp.Ns[:0]
	resp.Extra = resp.Extra[:0]
	udpLimit = dns.MinMsgSize

	var reqOpt *dns.OPT
	for _, rr := range req.Extra {
		if o, isOpt := rr.(*dns.OPT); isOpt {
			if reqOpt != nil { // RFC 6891 6.1.1: more than one OPT
				resp.Rcode = dns.RcodeFormatError
				return true, udpLimit
			}
			reqOpt = o
		}
	}
	if reqOpt != nil {
		udpLimit = min(max(int(reqOpt.UDPSize()), dns.MinMsgSize), s.opts.MaxUDPSize)
		*opt = dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: uint16(s.opts.MaxUDPSize)}}
		if reqOpt.Do() {
			opt.SetDo()
		}
		resp.Extra = append(resp.Extra, opt)
		if reqOpt.Version() != 0 {
			resp.Rcode = dns.RcodeBadVers
			return true, udpLimit
		}
	}
	if req.Opcode != dns.OpcodeQuery {
		resp.Rcode = dns.RcodeNotImplemented
		return true, udpLimit
	}
	if len(req.Question) != 1 {
		resp.Rcode = dns.RcodeFormatError
		return true, udpLimit
	}
	q := req.Question[0]
	resp.Question = append(resp.Question, q)
	if q.Qclass != dns.ClassINET || q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR {
		resp.Rcode = dns.RcodeRefused
		return true, udpLimit
	}
	s.lookup(s.table.Load(), q, resp)
	return true, udpLimit
}

// lookup answers question q from t.
func (s *Server) lookup(t *table, q dns.Question, resp *dns.Msg) {
	name := strings.ToLower(q.Name) // no allocation when already lower case
	e := t.names[name]
	if e == nil {
		z := t.zoneOf(name)
		if z == nil {
			// Not a name of ours: not a node, not inside a zone.
			resp.Rcode = dns.RcodeRefused
			return
		}
		resp.Authoritative = true
		resp.Rcode = dns.RcodeNameError
		resp.Ns = append(resp.Ns, z.soa...)
		return
	}
	resp.Authoritative = true
	switch q.Qtype {
	case dns.TypeA:
		resp.Answer = append(resp.Answer, e.a...)
	case dns.TypeAAAA:
		resp.Answer = append(resp.Answer, e.aaaa...)
	case dns.TypePTR:
		resp.Answer = append(resp.Answer, e.ptr...)
	case dns.TypeSOA:
		if e.apex {
			resp.Answer = append(resp.Answer, e.zone.soa...)
		}
	case dns.TypeNS:
		if e.apex {
			resp.Answer = append(resp.Answer, e.zone.ns...)
		}
	case dns.TypeANY:
		resp.Answer = append(resp.Answer, e.a...)
		resp.Answer = append(resp.Answer, e.aaaa...)
		resp.Answer = append(resp.Answer, e.ptr...)
		if e.apex {
			resp.Answer = append(resp.Answer, e.zone.soa...)
			resp.Answer = append(resp.Answer, e.zone.ns...)
		}
	}
	if len(resp.Answer) == 0 {
		if e.zone != nil { // NODATA: the SOA gives the negative TTL
			resp.Ns = append(resp.Ns, e.zone.soa...)
		}
		return
	}
	if name != q.Name {
		// The records are owned by the lower-case name; answer with the
		// spelling of the question (resolvers using 0x20 check it).
		for i, rr := range resp.Answer {
			rr = dns.Copy(rr)
			rr.Header().Name = q.Name
			resp.Answer[i] = rr
		}
	}
}

// pack packs resp into buf within limit bytes: uncompressed when it fits,
// compressed when that makes it fit, and otherwise truncated to its header,
// question and OPT with the TC bit set, so that the client retries over
// TCP.
func pack(resp *dns.Msg, buf []byte, limit int) ([]byte, error) {
	out, err := resp.PackBuffer(buf)
	if err != nil || len(out) <= limit {
		return out, err
	}
	resp.Compress = true
	out, err = resp.PackBuffer(buf)
	if err != nil || len(out) <= limit {
		return out, err
	}
	resp.Truncated = true
	resp.Answer = resp.Answer[:0]
	resp.Ns = resp.Ns[:0]
	return resp.PackBuffer(buf)
}
