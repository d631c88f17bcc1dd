package tunnelserver

import (
	"net"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tether-edge/tether/internal/testenv"
)

// --udp-buffer sizes the listening socket's buffers, and the log says so.
func TestUDPBuffer(t *testing.T) {
	const size = 12 << 20
	var logs logBuffer
	f := startWith(t, func(o *Options) {
		o.UDPBuffer = size
		o.Logger = logs.logger()
	})
	rcv, snd, _, err := setUDPBuffers(f.srv.udp, size) // reads them back
	if err != nil {
		t.Fatal(err)
	}
	// As root the buffers are forced past net.core.rmem_max; without
	// CAP_NET_ADMIN the kernel may cap them, and the gateway warns.
	if forced := unix.Geteuid() == 0; forced && (rcv < size || snd < size) {
		t.Fatalf("buffers receive %d, send %d; want %d each", rcv, snd, size)
	}
	if !strings.Contains(logs.String(), "UDP socket buffers") && !strings.Contains(logs.String(), "smaller buffers than --udp-buffer") {
		t.Fatalf("no log line about the UDP buffers:\n%s", logs.String())
	}
}

// udpDrops counts the datagrams a full receive buffer dropped.
func TestUDPDrops(t *testing.T) {
	rx, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	if err := rx.SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	if n, err := udpDrops(rx); err != nil || n != 0 {
		t.Fatalf("drops of a new socket: %d, %v; want 0", n, err)
	}
	tx, err := net.DialUDP("udp", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	buf := make([]byte, 1200)
	for range 200 { // far more than 4 KiB (8 KiB as the kernel counts) holds
		tx.Write(buf)
	}
	// Loopback delivers synchronously, but poll anyway.
	testenv.Eventually(t, "a drop counted after 200 datagrams into a 4 KiB buffer", func() bool {
		n, err := udpDrops(rx)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}
