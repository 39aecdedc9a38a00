package replication

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// pacedReader sits between the replication connection's socket and the
// protocol reader (pgconn's Frontend): every read from the socket goes
// through it, and it paces them as the pacer says (see pace.go).
type pacedReader struct {
	r    io.Reader // pgconn's reader of the connection
	conn net.Conn  // the connection, for read deadlines; nil until streaming
	// raw is the TCP socket, to wait for queued bytes without reading them
	// (SO_RCVLOWAT); nil where that is not possible, then a trickle is read
	// as it comes.
	raw  syscall.RawConn
	pace pacer
	// fresh: the next Read starts a new message with nothing buffered; a
	// Read that completes a message is never delayed.
	fresh    bool
	deadline time.Time // the receive loop's read deadline
	low      int       // SO_RCVLOWAT as last set; 0 means the default, 1
}

// stream starts pacing reads from conn, the replication connection.
func (pr *pacedReader) stream(conn net.Conn) {
	pr.conn = conn
	c := conn
	if u, ok := c.(interface{ NetConn() net.Conn }); ok { // TLS
		c = u.NetConn()
	}
	if tcp, ok := c.(*net.TCPConn); ok && lowWaterWorks {
		pr.raw, _ = tcp.SyscallConn()
	}
}

// setDeadline sets the receive loop's read deadline.
func (pr *pacedReader) setDeadline(t time.Time) error {
	pr.deadline = t
	return pr.conn.SetReadDeadline(t)
}

func (pr *pacedReader) Read(p []byte) (int, error) {
	if pr.conn == nil {
		return pr.r.Read(p)
	}
	queued := false // low bytes are known to be queued
	if pr.fresh {
		pr.fresh = false
		s := pr.pace.next(time.Now())
		switch {
		case s.sleep > 0:
			time.Sleep(s.sleep)
			pr.pace.napped(time.Now())
		case s.low > 0 && pr.raw != nil:
			var err error
			if queued, err = pr.wait(s.low, s.wait); err != nil {
				return 0, err
			}
		}
	}
	if !queued && pr.low > 1 {
		// This read may have to wait: for the next byte, not for a batch.
		if err := pr.setLow(1); err != nil {
			return 0, err
		}
	}
	n, err := pr.r.Read(p)
	if n > 0 {
		pr.pace.read(time.Now(), n, n == len(p))
	}
	return n, err
}

// wait waits until low bytes are queued on the socket or d passes (or the
// receive loop's deadline, if sooner), without reading.
func (pr *pacedReader) wait(low int, d time.Duration) (queued bool, err error) {
	if low != pr.low {
		if err := pr.setLow(low); err != nil {
			return false, err
		}
	}
	until := time.Now().Add(d)
	if !pr.deadline.IsZero() && pr.deadline.Before(until) {
		until = pr.deadline
	}
	if err := pr.conn.SetReadDeadline(until); err != nil {
		return false, err
	}
	first := true
	err = pr.raw.Read(func(fd uintptr) bool {
		if !first {
			return true // the socket was reported readable
		}
		first = false
		// Low bytes may be queued already: the sender then may send
		// nothing more (its buffers full while reading paused), and no
		// segment would come to report the socket readable.
		return queuedBytes(fd) >= low
	})
	if derr := pr.conn.SetReadDeadline(pr.deadline); derr != nil {
		return false, derr
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return false, nil
	}
	return err == nil, err
}

func (pr *pacedReader) setLow(n int) error {
	var serr error
	err := pr.raw.Control(func(fd uintptr) { serr = setLowWater(fd, n) })
	if err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	pr.low = n
	return nil
}
