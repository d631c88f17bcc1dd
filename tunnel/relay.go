package tunnel

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// Stream error codes sent in RESET_STREAM and STOP_SENDING frames.
const (
	// StreamErrAbort: the other end of the relayed TCP connection failed
	// (reset, idle timeout), so this stream is abandoned.
	StreamErrAbort quic.StreamErrorCode = 1
)

// Stream is the part of *quic.Stream that Relay uses.
type Stream interface {
	io.Reader
	io.Writer
	// Close ends the write direction (a FIN); reading goes on.
	Close() error
	CancelRead(quic.StreamErrorCode)
	CancelWrite(quic.StreamErrorCode)
}

var _ Stream = (*quic.Stream)(nil)

// Conn is the part of *net.TCPConn that Relay uses.
type Conn interface {
	io.Reader
	io.Writer
	io.Closer
	CloseWrite() error
}

var _ Conn = (*net.TCPConn)(nil)

// RelayOptions tune a Relay; the zero value is usable.
type RelayOptions struct {
	// Idle aborts the relay after this long without a byte in either
	// direction. Zero means no idle limit.
	Idle time.Duration
	// ToStream and FromStream, when set, are incremented as bytes move
	// (live, so that /status can show long-running connections).
	ToStream, FromStream *atomic.Int64
}

// ErrIdle is returned by Relay when RelayOptions.Idle expired.
var ErrIdle = errors.New("relay idle for too long")

// Relay copies bytes between c and s in both directions until both are
// done. End of input in one direction is passed on as a half-close (FIN on
// the stream, CloseWrite on the TCP connection), so protocols that close
// their sending side early keep working. If either direction fails, both
// are torn down. Relay closes c and both directions of s before it returns.
func Relay(c Conn, s Stream, opts RelayOptions) error {
	r := relay{c: c, s: s}
	if opts.Idle > 0 {
		r.idle = opts.Idle
		r.touch()
		r.timer = time.AfterFunc(opts.Idle, r.checkIdle)
		defer r.timer.Stop()
	}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := r.copy(s, c, opts.ToStream)
		if peerStoppedReading(err) {
			// The other end wants no more (its reply, a refusal, may
			// still be on its way): this direction ends, the other
			// goes on.
			return
		}
		if err != nil {
			r.fail(err)
			return
		}
		s.Close() // FIN: the client has nothing more to say
	}()
	err := r.copy(c, s, opts.FromStream)
	if err != nil {
		r.fail(err)
	} else if err := c.CloseWrite(); err != nil {
		r.fail(err)
	}
	wg.Wait()
	c.Close()
	s.CancelRead(0) // no-op once the FIN arrived; frees the stream otherwise
	return r.finish()
}

// peerStoppedReading reports whether err is the peer's STOP_SENDING with
// code 0: it has read all it wants (an edge that refused a request, or
// finished its relay), which ends only the sending direction.
func peerStoppedReading(err error) bool {
	var se *quic.StreamError
	return errors.As(err, &se) && se.Remote && se.ErrorCode == 0
}

type relay struct {
	c     Conn
	s     Stream
	idle  time.Duration
	timer *time.Timer
	last  atomic.Int64 // unix nanos of the last byte moved

	done     atomic.Bool
	once     sync.Once
	firstErr error
}

// Buffers of a relay direction. A direction starts on a small buffer, and
// idles on one (an idle relayed connection holds two per process). When a
// read fills it, more data was waiting: the direction takes a large
// buffer, if fewer than maxLarge are in use in the process, and keeps it
// until a read returns less than smallBuf/16 (a trickle, or the end of a
// burst). Large reads make fewer and larger writes on the other side:
// fewer Writes into the QUIC stream, each of which wakes quic-go's send
// loop, on the edge; fewer and larger TCP writes on the gateway. See
// tunnel/README.md, "The relay's cost per byte", for what it bought.
const (
	smallBuf = 64 << 10
	largeBuf = 1 << 20
	// maxLarge bounds the large buffers in use: 32 MiB per process
	// (released ones wait in largePool until the GC drops them).
	maxLarge = 32
)

var (
	smallPool  = sync.Pool{New: func() any { b := make([]byte, smallBuf); return &b }}
	largePool  = sync.Pool{New: func() any { b := make([]byte, largeBuf); return &b }}
	largeInUse atomic.Int32
)

// relayBuf is the buffer a relay direction reads into.
type relayBuf struct {
	p     *[]byte
	large bool
}

func newRelayBuf() relayBuf { return relayBuf{p: smallPool.Get().(*[]byte)} }

// adapt switches to a large buffer after a read of n bytes filled the
// small one, and back after a short read.
func (b *relayBuf) adapt(n int) {
	switch {
	case !b.large && n == smallBuf:
		if largeInUse.Add(1) > maxLarge {
			largeInUse.Add(-1)
			return
		}
		smallPool.Put(b.p)
		b.p, b.large = largePool.Get().(*[]byte), true
	case b.large && n < smallBuf/16:
		b.release()
		b.p = smallPool.Get().(*[]byte)
	}
}

// release gives the buffer back.
func (b *relayBuf) release() {
	if b.large {
		largePool.Put(b.p)
		largeInUse.Add(-1)
		b.large = false
	} else {
		smallPool.Put(b.p)
	}
	b.p = nil
}

// copy moves bytes from src to dst until EOF (nil) or an error.
func (r *relay) copy(dst io.Writer, src io.Reader, counter *atomic.Int64) error {
	b := newRelayBuf()
	defer b.release()
	for {
		buf := *b.p
		n, rerr := src.Read(buf)
		if n > 0 {
			r.touch()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
			if counter != nil {
				counter.Add(int64(n))
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
		b.adapt(n)
	}
}

func (r *relay) touch() {
	if r.idle > 0 {
		r.last.Store(time.Now().UnixNano())
	}
}

func (r *relay) checkIdle() {
	if r.done.Load() {
		return
	}
	since := time.Since(time.Unix(0, r.last.Load()))
	if since >= r.idle {
		r.fail(ErrIdle)
		return
	}
	r.timer.Reset(r.idle - since)
}

// fail records the first error and tears both sides down, which unblocks
// whichever copy is still running.
func (r *relay) fail(err error) {
	r.once.Do(func() {
		r.firstErr = err
		r.s.CancelRead(StreamErrAbort)
		r.s.CancelWrite(StreamErrAbort)
		if l, ok := r.c.(interface{ SetLinger(int) error }); ok {
			l.SetLinger(0) // pass the failure on as a reset, not a clean close
		}
		r.c.Close()
	})
}

// finish makes later fail calls (a late idle timer) no-ops and returns the
// first failure, if any.
func (r *relay) finish() error {
	r.done.Store(true)
	r.once.Do(func() {})
	return r.firstErr
}
