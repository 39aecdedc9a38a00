package replication

import (
	"io"
	"time"
)

// The walsender sends each message on its own, a few hundred bytes at a
// time. Reading them one by one as they come costs a system call and a
// goroutine wake-up per message: CPU the walsender needs when it shares the
// machine. napReader sits under the protocol's buffered reader, so it is
// asked to read only when everything read before is consumed. If that read
// was small and recent, the stream is trickling: it naps briefly first, so
// the next read takes what gathered meanwhile in one call. A read that
// filled much of the buffer (the walsender is ahead) or an idle stream
// reads at once, so a backlog is read at full speed and the first event
// after a quiet spell waits for nothing.
type napReader struct {
	r     io.Reader
	sleep func(time.Duration)
	last  time.Time // when the last read returned data
	lastN int       // how much it returned
}

const (
	// nap is short against every latency that matters (the producer's
	// linger alone is 5 ms) and long enough for dozens of messages to gather
	// at tens of thousands of events per second.
	nap = 300 * time.Microsecond
	// napBelow: a read returning less than this was not limited by the
	// buffer, so the socket had run dry.
	napBelow = 32 << 10
	// napWithin: only a read soon after the last one naps; a stream quiet
	// for longer is not trickling.
	napWithin = 2 * time.Millisecond
)

func newNapReader(r io.Reader) *napReader { return &napReader{r: r, sleep: time.Sleep} }

func (n *napReader) Read(p []byte) (int, error) {
	if n.lastN > 0 && n.lastN < napBelow && time.Since(n.last) < napWithin {
		n.sleep(nap)
	}
	k, err := n.r.Read(p)
	n.lastN = k
	if k > 0 {
		n.last = time.Now()
	}
	return k, err
}
