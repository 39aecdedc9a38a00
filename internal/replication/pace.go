package replication

import "time"

// The walsender sends every message on its own (a Begin, each row, a
// Commit, each in its own TCP segment), and every segment that arrives
// wakes the process: Go's network poller sees the socket become readable
// whether or not a goroutine is reading it, so even a reader that sleeps
// between reads is woken per segment. At a steady 1,000 events/s that was
// most of the streamer's CPU, and on a small machine it is CPU the
// walsender needs. So before reading the socket the receive loop decides,
// from what the last reads brought, how to let messages gather:
//
//   - A trickle (reads that leave room in the buffer: the walsender is not
//     ahead, events come at a steady rate): ask the kernel to report the socket
//     readable only once low bytes are queued (SO_RCVLOWAT), low being
//     what arrives in about gather at the recent rate, and wait for that
//     or for gather to pass, whichever is first; then read all of it in one
//     call. The process is woken once per batch instead of once per
//     segment, and an event waits at most gather for its batch.
//   - A flood (a read that filled the buffer, or more than a buffer's worth
//     a millisecond: a backlog, the walsender ahead): read on, but sleep
//     for nap after every napEvery of reading,
//     so that a few dozen messages gather per read and the walsender keeps
//     its CPU. Go rounds a sleep shorter than a millisecond up to one (the
//     poller waits in whole milliseconds), so a nap lasts a millisecond.
//   - Quiet (events too rare to batch, or the first after a pause): read
//     at once; the read blocks until a byte arrives.
const (
	// gather bounds the latency batching adds.
	gather = 5 * time.Millisecond
	// minLow and maxLow bound the batch: below minLow (about one event)
	// there is nothing to batch; maxLow leaves room in the protocol
	// reader's 8 KiB buffer, so that a batch is one read.
	minLow = 1 << 10
	maxLow = 6 << 10
	// nap and napEvery are the flood's pace, tuned on backlog drains
	// (bench/results/cpu-per-event.md): reading longer between naps cost
	// more CPU per event, reading shorter fell behind the walsender.
	nap      = 300 * time.Microsecond
	napEvery = 500 * time.Microsecond
	// floodRate is a buffer's worth a millisecond: above it, reads are
	// paced like a flood. Waiting for queued bytes in a backlog drain of
	// single-row transactions made it slower than naps do.
	floodRate = 8 << 20 // bytes per second
	// rateEvery is how often the arrival rate is estimated again; after
	// rateStale without a read the estimate is forgotten, so that the first
	// event after a pause is read at once.
	rateEvery = 20 * time.Millisecond
	rateStale = 100 * time.Millisecond
)

// step is what to do before the next read from the socket.
type step struct {
	// sleep before reading (a flood's nap).
	sleep time.Duration
	// low > 0: wait until low bytes are queued or until wait passed, then
	// read.
	low  int
	wait time.Duration
}

// pacer decides how to read the socket from what the reads brought. It
// does no I/O; the reader tells it what happened.
type pacer struct {
	lastNap  time.Time // when the last nap ended
	lastRead time.Time
	full     bool // the last read filled the buffer: more is waiting

	// The arrival rate, bytes per second, from the bytes read over at
	// least rateEvery.
	rate       float64
	since      time.Time
	sinceBytes int
}

// read records that a read from the socket at now brought n bytes, and
// whether they filled the buffer.
func (p *pacer) read(now time.Time, n int, full bool) {
	if now.Sub(p.lastRead) > rateStale {
		p.rate, p.since, p.sinceBytes = 0, now, 0
	}
	p.full, p.lastRead = full, now
	if p.since.IsZero() {
		p.since = now
	}
	p.sinceBytes += n
	if el := now.Sub(p.since); el >= rateEvery {
		r := float64(p.sinceBytes) / el.Seconds()
		if p.rate == 0 {
			p.rate = r
		} else {
			p.rate = (p.rate + r) / 2
		}
		p.since, p.sinceBytes = now, 0
	}
}

// napped records that a nap ended at now.
func (p *pacer) napped(now time.Time) { p.lastNap = now }

// next is what to do at now before reading the socket for a new message.
func (p *pacer) next(now time.Time) step {
	if p.full || p.rate > floodRate && now.Sub(p.lastRead) <= rateStale {
		if now.Sub(p.lastNap) >= napEvery {
			return step{sleep: nap}
		}
		return step{}
	}
	if now.Sub(p.lastRead) > rateStale {
		return step{}
	}
	// The bytes that arrive in three quarters of gather at the recent
	// rate: most batches end when they are complete rather than on the
	// clock, and the clock ends the rest.
	low := int(p.rate * gather.Seconds() * 3 / 4)
	if low < minLow {
		return step{}
	}
	return step{low: min(low, maxLow), wait: gather}
}
