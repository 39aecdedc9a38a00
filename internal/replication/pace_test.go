package replication

import (
	"testing"
	"time"
)

// TestPacer walks the receive loop's pacing through a quiet start, a
// steady trickle and a flood.
func TestPacer(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var p pacer
	if s := p.next(t0); s != (step{}) {
		t.Fatalf("first read: %+v, want to read at once", s)
	}

	// 100 events/s of ~700 bytes: too rare to batch, read at once.
	now := t0
	for range 10 {
		now = now.Add(10 * time.Millisecond)
		p.read(now, 700, false)
	}
	if s := p.next(now); s != (step{}) {
		t.Fatalf("at 70 KB/s: %+v, want to read at once", s)
	}

	// 1,000 events/s: 700 KB/s, wait for what arrives in 3/4 of gather.
	for range 200 {
		now = now.Add(time.Millisecond)
		p.read(now, 700, false)
	}
	s := p.next(now)
	want := int(700e3 * gather.Seconds() * 3 / 4)
	if s.sleep != 0 || s.wait != gather || s.low < want*9/10 || s.low > want*11/10 {
		t.Fatalf("at 700 KB/s: %+v, want to wait up to %s for about %d bytes", s, gather, want)
	}

	// 5,000 events/s: the batch is capped below the read buffer.
	for range 200 {
		now = now.Add(time.Millisecond)
		p.read(now, 3500, false)
	}
	if s := p.next(now); s.low != maxLow || s.wait != gather {
		t.Fatalf("at 3.5 MB/s: %+v, want to wait up to %s for %d bytes", s, gather, maxLow)
	}

	// A backlog read in reads that leave room in the buffer, at more than
	// floodRate: paced like a flood, not batched.
	for range 200 {
		now = now.Add(time.Millisecond)
		p.read(now, 12000, false)
	}
	p.napped(now.Add(-napEvery))
	if s := p.next(now); s != (step{sleep: nap}) {
		t.Fatalf("at 12 MB/s: %+v, want a nap", s)
	}

	// A pause: the first event after it is read at once, whatever the rate
	// was.
	if s := p.next(now.Add(time.Second)); s != (step{}) {
		t.Fatalf("a second after the last read: %+v, want to read at once", s)
	}

	// A flood: a read filled the buffer. Read on right after a nap, nap
	// again after napEvery.
	p.napped(now)
	now = now.Add(100 * time.Microsecond)
	p.read(now, 8192, true)
	if s := p.next(now); s != (step{}) {
		t.Fatalf("flood right after a nap: %+v, want to read at once", s)
	}
	now = now.Add(napEvery)
	p.read(now, 8192, true)
	if s := p.next(now); s != (step{sleep: nap}) {
		t.Fatalf("flood %s after the last nap: %+v, want a nap", napEvery, s)
	}
}
