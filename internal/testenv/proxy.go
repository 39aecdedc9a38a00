package testenv

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy for network-fault tests: it listens on 127.0.0.1 and
// forwards every connection to a target, until told to cut or to go
// silent.
//
//   - Cut closes every open connection, both sides, with a reset (linger 0),
//     as a dropped link or a firewall's RST would; new connections are
//     accepted and forwarded as before.
//   - Blackhole stops forwarding in both directions without closing
//     anything: bytes already read are held, the rest stays in the kernel's
//     buffers, and new connections are accepted but not forwarded (the
//     target is not even dialled). Neither side learns anything: the silent
//     network that only timeouts detect.
//   - Restore ends the blackhole: held and buffered bytes flow again, as when
//     a partition heals and TCP retransmits, and waiting connections are
//     dialled through.
//   - DelayKafka holds every Kafka request of one API (a Fetch, say) for a
//     while before forwarding it: a broker slow to answer that request
//     alone, as one just restarted or loaded.
type Proxy struct {
	ln     net.Listener
	target string // under mu: Retarget changes it

	// delayAPI and delay are DelayKafka's: requests of Kafka API key
	// delayAPI wait delay; delay 0 forwards bytes as they come.
	delayAPI int16
	delay    time.Duration

	mu     sync.Mutex
	cond   *sync.Cond // signalled when silent or closed changes
	silent bool
	closed bool
	conns  map[*link]struct{}
	wg     sync.WaitGroup
}

// link is one proxied connection: the accepted client side and, once
// dialled, the target side.
type link struct {
	client, server net.Conn
}

// NewProxy listens on addr (host:port; "127.0.0.1:0" for a free port) and
// forwards to target. It is closed at cleanup.
func NewProxy(t testing.TB, addr, target string) *Proxy {
	t.Helper()
	p, err := StartProxy(addr, target)
	if err != nil {
		t.Fatalf("proxy on %s to %s: %v", addr, target, err)
	}
	t.Cleanup(p.Close)
	return p
}

// StartProxy is NewProxy without a test: the caller closes it.
func StartProxy(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[*link]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Retarget forwards the connections accepted from now on to target (a
// server put back in another one's place at the same address); open ones
// stay with the old target until cut.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut resets every open connection and returns how many there were; the
// proxy keeps accepting.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns)
	for l := range p.conns {
		delete(p.conns, l)
		l.close(true)
	}
	p.cond.Broadcast()
	return n
}

// Blackhole stops forwarding bytes, in both directions and on new
// connections, until Restore.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silent = true
	p.cond.Broadcast()
}

// Restore forwards again what the blackhole held.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silent = false
	p.cond.Broadcast()
}

// DelayKafka makes the proxy hold each Kafka request of API key api (1 is
// Fetch) for d before forwarding it; other requests, and every response,
// cross as before. Connections opened from then on read the client's bytes
// as Kafka request frames (a 4-byte size, then the API key first): call it
// before the client connects.
func (p *Proxy) DelayKafka(api int16, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delayAPI, p.delay = api, d
}

// Conns is the number of open connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops listening, resets every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		l := &link{client: c}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(l)
	}
}

// serve dials the target once the proxy is not silent, then copies both
// ways until either side ends or the link is cut.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	if !p.await(l) {
		return
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	server, err := net.DialTimeout("tcp", target, 10*time.Second)
	if err != nil {
		p.drop(l)
		return
	}
	p.mu.Lock()
	if _, open := p.conns[l]; !open || p.closed {
		p.mu.Unlock()
		_ = server.Close()
		return
	}
	l.server = server
	api, delay := p.delayAPI, p.delay
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() {
		if delay > 0 {
			p.copyKafkaRequests(l, server, l.client, api, delay)
		} else {
			p.copy(l, server, l.client)
		}
		done <- struct{}{}
	}()
	go func() { p.copy(l, l.client, server); done <- struct{}{} }()
	<-done
	// One direction ended (the peer closed, or a cut): end the link, which
	// ends the other.
	p.drop(l)
	<-done
}

// await blocks while the proxy is silent; it reports false when the link
// was cut or the proxy closed meanwhile.
func (p *Proxy) await(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if _, open := p.conns[l]; !open || p.closed {
			return false
		}
		if !p.silent {
			return true
		}
		p.cond.Wait()
	}
}

// copy forwards src to dst. Each chunk read is held while the proxy is
// silent, so nothing crosses a blackhole; a read that is not started leaves
// the rest in the kernel, whose full buffers then stall the sender as a
// silent network does. A side that closes ends the link, which closes the
// other: the peers see the close the way the proxy did (an orderly one as
// such, a cut as a reset).
func (p *Proxy) copy(l *link, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		if !p.await(l) {
			return
		}
		n, err := src.Read(buf)
		// Whatever the read brought, bytes or the peer's close, waits
		// for the blackhole to end: a silent network does not pass a
		// FIN or a reset either.
		if !p.await(l) {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// copyKafkaRequests forwards src to dst one Kafka request frame at a time,
// holding each of API key api for delay (the fault itself, so a plain
// sleep: the link's end is noticed at the next write) and every frame while
// the proxy is silent.
func (p *Proxy) copyKafkaRequests(l *link, dst, src net.Conn, api int16, delay time.Duration) {
	r := bufio.NewReaderSize(src, 32<<10)
	for {
		var size [4]byte
		if _, err := io.ReadFull(r, size[:]); err != nil {
			return
		}
		frame := make([]byte, 4+binary.BigEndian.Uint32(size[:]))
		copy(frame, size[:])
		if _, err := io.ReadFull(r, frame[4:]); err != nil {
			return
		}
		if len(frame) >= 6 && int16(binary.BigEndian.Uint16(frame[4:])) == api {
			time.Sleep(delay)
		}
		if !p.await(l) {
			return
		}
		if _, err := dst.Write(frame); err != nil {
			return
		}
	}
}

// drop forgets a link that ended by itself and closes both sides.
func (p *Proxy) drop(l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, open := p.conns[l]; open {
		delete(p.conns, l)
		l.close(false)
	}
	p.cond.Broadcast()
}

// close closes both sides; reset sets linger 0 first, so the peers get a
// reset (RST) rather than an orderly end. The caller holds p.mu and has
// removed l from p.conns, so copies waiting in await see it is gone when
// the next broadcast wakes them.
func (l *link) close(reset bool) {
	for _, c := range []net.Conn{l.client, l.server} {
		if c == nil {
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok && reset {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}
