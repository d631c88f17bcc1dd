package tunnel

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

var relayBulk = flag.Int64("relay.bulk", 64<<20, "bytes of each BenchmarkRelay transfer")

// BenchmarkRelay is the relay's cost per byte: one connection per
// iteration carries -relay.bulk bytes from a TCP server (the kubelet)
// through the edge side's Relay, a QUIC stream over loopback UDP and the
// gateway side's Relay to a TCP client, as GET /bytes does in make
// bench-tunnel. bare is the same stream without TCP and relays (the
// edge side writes 64 KiB at a time from memory, the gateway side reads
// 64 KiB at a time), the reference of issue 19. Both ends of everything
// run in this process: cpu-ns/B is its CPU time (user and system, from
// getrusage) per byte, which on loopback also includes the kernel's
// receive work. quic-B/write and tcp-B/write are the mean sizes of the
// relays' writes into the QUIC stream (edge side) and into the TCP
// connection (gateway side).
//
//	go test -run '^$' -bench Relay -benchtime 5x ./tunnel/
func BenchmarkRelay(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		gw, edge := listenEnds(b, 0, QUICConfig(Limits{}), QUICConfig(Limits{})).dial()
		n := *relayBulk
		b.SetBytes(n)
		cpu0 := cpuTime()
		b.ResetTimer()
		for range b.N {
			if err := bulk(gw, edge, n); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(cpuTime()-cpu0)/float64(n*int64(b.N)), "cpu-ns/B")
	})
	b.Run("relay", func(b *testing.B) {
		gw, edge := listenEnds(b, 0, QUICConfig(Limits{}), QUICConfig(Limits{})).dial()
		n := *relayBulk
		b.SetBytes(n)
		var st relayStats
		cpu0 := cpuTime()
		b.ResetTimer()
		for range b.N {
			if err := relayBulkOnce(b, gw, edge, n, &st); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(cpuTime()-cpu0)/float64(n*int64(b.N)), "cpu-ns/B")
		b.ReportMetric(float64(st.quicBytes.Load())/float64(max(st.quicWrites.Load(), 1)), "quic-B/write")
		b.ReportMetric(float64(st.tcpBytes.Load())/float64(max(st.tcpWrites.Load(), 1)), "tcp-B/write")
	})
}

// cpuTime is this process's CPU time (user and system) so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// relayStats counts the relays' writes into the QUIC stream (edge side)
// and into the TCP connection (gateway side).
type relayStats struct {
	quicWrites, quicBytes atomic.Int64
	tcpWrites, tcpBytes   atomic.Int64
}

type countingStream struct {
	Stream
	writes, bytes *atomic.Int64
}

func (s countingStream) Write(p []byte) (int, error) {
	s.writes.Add(1)
	s.bytes.Add(int64(len(p)))
	return s.Stream.Write(p)
}

type countingConn struct {
	*net.TCPConn
	writes, bytes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	c.bytes.Add(int64(len(p)))
	return c.TCPConn.Write(p)
}

// relayBulkOnce relays one connection carrying n bytes from a TCP server
// behind the edge to a TCP client of the gateway, and waits for both
// relays to end.
func relayBulkOnce(tb testing.TB, gw, edge *quic.Conn, n int64, st *relayStats) error {
	client, gwSide := tcpPair(tb)
	edgeSide, server := tcpPair(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	gs, err := gw.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	if _, err := gs.Write([]byte{0}); err != nil { // announces the stream
		return err
	}
	es, err := edge.AcceptStream(ctx)
	if err != nil {
		return err
	}
	if _, err := io.ReadFull(es, make([]byte, 1)); err != nil {
		return err
	}
	// Idle limits as both programs set them: the relay then notes the
	// time of every read.
	opts := RelayOptions{Idle: time.Hour}
	gwDone, edgeDone := make(chan error, 1), make(chan error, 1)
	go func() {
		gwDone <- Relay(countingConn{gwSide, &st.tcpWrites, &st.tcpBytes}, gs, opts)
	}()
	go func() {
		edgeDone <- Relay(edgeSide, countingStream{es, &st.quicWrites, &st.quicBytes}, opts)
	}()
	served := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for left := n; left > 0; {
			k, err := server.Write(buf[:min(left, int64(len(buf)))])
			if err != nil {
				served <- err
				return
			}
			left -= int64(k)
		}
		served <- server.CloseWrite()
	}()
	client.CloseWrite() // the request is sent
	got, err := io.CopyBuffer(io.Discard, client, make([]byte, 64<<10))
	if err != nil {
		return fmt.Errorf("after %d bytes: %w", got, err)
	}
	if got != n {
		return fmt.Errorf("%d bytes, want %d", got, n)
	}
	if err := <-served; err != nil {
		return fmt.Errorf("server: %w", err)
	}
	for _, ch := range []chan error{gwDone, edgeDone} {
		select {
		case err := <-ch:
			if err != nil {
				return fmt.Errorf("relay: %w", err)
			}
		case <-ctx.Done():
			return fmt.Errorf("relay did not end")
		}
	}
	return nil
}
