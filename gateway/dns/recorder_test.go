package dns

import (
	"net"

	"github.com/miekg/dns"
)

// recorder is a dns.ResponseWriter that keeps what is written.
type recorder struct {
	via transport
	out []byte
}

var _ dns.ResponseWriter = (*recorder)(nil)

func (r *recorder) LocalAddr() net.Addr {
	if r.via == overTCP {
		return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53}
	}
	return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53}
}

func (r *recorder) RemoteAddr() net.Addr {
	if r.via == overTCP {
		return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4053}
	}
	return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4053}
}

func (r *recorder) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	_, err = r.Write(b)
	return err
}

func (r *recorder) Write(b []byte) (int, error) {
	r.out = append([]byte(nil), b...)
	return len(b), nil
}

func (r *recorder) Close() error        { return nil }
func (r *recorder) TsigStatus() error   { return nil }
func (r *recorder) TsigTimersOnly(bool) {}
func (r *recorder) Hijack()             {}
