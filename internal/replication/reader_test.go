//go:build linux

package replication

import (
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tcpPair is a connected loopback TCP pair: the paced reader needs a real
// socket (SO_RCVLOWAT, SIOCINQ).
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func newTestReader(t *testing.T, c net.Conn) *pacedReader {
	t.Helper()
	pr := &pacedReader{r: c}
	pr.stream(c)
	if !lowWaterWorks {
		t.Skip("no SO_RCVLOWAT batching on this system")
	}
	if pr.raw == nil {
		t.Fatal("a TCP connection got no raw socket")
	}
	if err := pr.setDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	return pr
}

// TestBatchWaitEndsWhenBytesAreQueuedAlready: bytes that arrived before
// the wait began must end it at once. Reading paused for Kafka lets the
// socket fill and the walsender stop sending; no further segment would then
// report the socket readable, and a wait for one made every read of a
// backlog drain wait its whole period.
func TestBatchWaitEndsWhenBytesAreQueuedAlready(t *testing.T) {
	c, s := tcpPair(t)
	pr := newTestReader(t, c)
	// The mark is set before the bytes come, as it is from one batch to
	// the next: setting it would report queued bytes by itself.
	if err := pr.setLow(2048); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	// Let the bytes land in the client's receive queue.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		_ = pr.raw.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		if n >= 4096 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of 4096 bytes queued after 10s", n)
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	queued, err := pr.wait(2048, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !queued {
		t.Fatalf("wait for 2048 bytes with 4096 queued ran until its end (%s)", time.Since(start).Round(time.Millisecond))
	}
}

// TestReadAfterBatchWaitTakesOneByte: a read that may block (here one
// completing a message, not fresh) waits for the next byte, not for a
// batch: the low-water mark a batch wait set must not outlive it.
func TestReadAfterBatchWaitTakesOneByte(t *testing.T) {
	c, s := tcpPair(t)
	pr := newTestReader(t, c)
	// A batch wait that ends on its clock, nothing arriving.
	if queued, err := pr.wait(4096, 10*time.Millisecond); err != nil || queued {
		t.Fatalf("wait with nothing sent: queued %v, err %v", queued, err)
	}
	if pr.low != 4096 {
		t.Fatalf("SO_RCVLOWAT %d during the batch, want 4096", pr.low)
	}
	go func() { _, _ = s.Write([]byte{'x'}) }()
	buf := make([]byte, 64)
	n, err := io.ReadAtLeast(pr, buf, 1)
	if err != nil || n != 1 {
		t.Fatalf("read after the batch wait: %d bytes, %v (the one byte sent should arrive before the minute's deadline)", n, err)
	}
	if pr.low != 1 {
		t.Fatalf("SO_RCVLOWAT %d after a read that may block, want 1", pr.low)
	}
}
