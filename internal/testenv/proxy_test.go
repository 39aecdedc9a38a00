package testenv

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echo is a target that writes back whatever it reads.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads it back within wait; it returns what was
// read and the read's error.
func roundTrip(t *testing.T, c net.Conn, msg string, wait time.Duration) (string, error) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	return readWithin(c, len(msg), wait)
}

func readWithin(c net.Conn, n int, wait time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	b := make([]byte, n)
	got, err := io.ReadFull(c, b)
	return string(b[:got]), err
}

func TestProxyForwards(t *testing.T) {
	p := NewProxy(t, "127.0.0.1:0", echo(t))
	c := dial(t, p.Addr())
	if got, err := roundTrip(t, c, "ping", 5*time.Second); err != nil || got != "ping" {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	if p.Conns() != 1 {
		t.Fatalf("%d connections, want 1", p.Conns())
	}
}

func TestProxyCut(t *testing.T) {
	p := NewProxy(t, "127.0.0.1:0", echo(t))
	c := dial(t, p.Addr())
	if _, err := roundTrip(t, c, "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	// The open connection ends at once (a reset, or EOF if the close won).
	if _, err := readWithin(c, 1, 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after the cut: %v, want the connection closed", err)
	}
	// The proxy keeps accepting and forwarding.
	if got, err := roundTrip(t, dial(t, p.Addr()), "b", 5*time.Second); err != nil || got != "b" {
		t.Fatalf("new connection after the cut: %q, %v", got, err)
	}
}

func TestProxyBlackholeAndRestore(t *testing.T) {
	p := NewProxy(t, "127.0.0.1:0", echo(t))
	old := dial(t, p.Addr())
	if _, err := roundTrip(t, old, "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	// Nothing crosses, on the open connection nor on a new one, and
	// neither is closed.
	if got, err := roundTrip(t, old, "old", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("open connection in the blackhole: %q, %v; want a timeout", got, err)
	}
	fresh := dial(t, p.Addr())
	if got, err := roundTrip(t, fresh, "new", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection in the blackhole: %q, %v; want a timeout", got, err)
	}
	p.Restore()
	// What was held flows: both get their echo.
	for name, c := range map[string]net.Conn{"old": old, "new": fresh} {
		if got, err := readWithin(c, 3, 5*time.Second); err != nil || got != name {
			t.Fatalf("%s connection after restore: %q, %v", name, got, err)
		}
	}
}

func TestProxyCutInBlackhole(t *testing.T) {
	p, err := StartProxy("127.0.0.1:0", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	if _, err := roundTrip(t, c, "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	waiting := dial(t, p.Addr())
	eventuallyConns(t, p, 2)
	p.Cut()
	for _, c := range []net.Conn{c, waiting} {
		if _, err := readWithin(c, 1, 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read after a cut in the blackhole: %v, want the connection closed", err)
		}
	}
	// Close returns: no goroutine is left waiting for the blackhole to end.
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
}

func eventuallyConns(t *testing.T, p *Proxy, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); p.Conns() != n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections, want %d", p.Conns(), n)
		}
	}
}

// A peer that closes during the blackhole: the other side learns nothing
// until Restore.
func TestProxyBlackholeHoldsClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	p := NewProxy(t, "127.0.0.1:0", ln.Addr().String())
	c := dial(t, p.Addr())
	var server net.Conn
	select {
	case server = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy did not dial the target")
	}
	p.Blackhole()
	server.Close()
	if _, err := readWithin(c, 1, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read in the blackhole after the target closed: %v, want a timeout", err)
	}
	p.Restore()
	if _, err := readWithin(c, 1, 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after restore: %v, want the close", err)
	}
}

// kafkaFrame is a Kafka request frame of API key api: the size, then the
// key, then body.
func kafkaFrame(api int16, body string) string {
	b := binary.BigEndian.AppendUint32(nil, uint32(2+len(body)))
	b = binary.BigEndian.AppendUint16(b, uint16(api))
	return string(append(b, body...))
}

// TestProxyDelayKafka: frames of another API cross, and one of the delayed
// API crosses no sooner than the delay.
func TestProxyDelayKafka(t *testing.T) {
	p := NewProxy(t, "127.0.0.1:0", echo(t))
	const delay = time.Second
	p.DelayKafka(1, delay)
	c := dial(t, p.Addr())
	other, fetch := kafkaFrame(3, "metadata"), kafkaFrame(1, "fetch")
	start := time.Now()
	if got, err := roundTrip(t, c, other, 5*time.Second); err != nil || got != other {
		t.Fatalf("another API's request: %q, %v", got, err)
	}
	if got, err := roundTrip(t, c, fetch, 10*time.Second); err != nil || got != fetch {
		t.Fatalf("the delayed API's request: %q, %v", got, err)
	}
	if took := time.Since(start); took < delay {
		t.Fatalf("the delayed request came back after %s, before the delay of %s", took, delay)
	}
}
