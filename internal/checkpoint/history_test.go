package checkpoint_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
)

var committed = time.Date(2026, 12, 1, 21, 0, 0, 123456000, time.UTC)

// TestDecide: what a checkpoint lets the stream skip on each history it may
// meet. Written on the server's own timeline, or before the end of an
// earlier timeline of its history: skipped once verified (a restore keeps
// the timeline and reuses LSNs). Past the fork of the history: up to the
// fork only, and the rest is a lost history; past the server's flushed
// WAL: nothing, a lost history. Without a timeline (an older record) or on
// a timeline the history does not have: nothing.
func TestDecide(t *testing.T) {
	mark := func(tl int32, end pglogrepl.LSN) checkpoint.Mark {
		return checkpoint.Mark{End: end, Timeline: tl, Xid: 740, CommitTime: committed}
	}
	// Timeline 3's history: 1 ended at 0/3000060, 2 at 0/5000000.
	ends := map[int32]pglogrepl.LSN{1: 0x3000060, 2: 0x5000000}
	for _, c := range []struct {
		name     string
		m        checkpoint.Mark
		timeline int32
		ends     map[int32]pglogrepl.LSN
		want     checkpoint.Trust
		why      string
	}{
		{"same timeline, never failed over", mark(1, 0x4000000), 1, nil, checkpoint.Trust{Verify: true}, ""},
		{"same timeline after failovers", mark(3, 0x6000000), 3, ends, checkpoint.Trust{Verify: true}, ""},
		{"written before the fork", mark(2, 0x4FFFFFF), 3, ends, checkpoint.Trust{Verify: true}, ""},
		{"written at the fork", mark(2, 0x5000000), 3, ends, checkpoint.Trust{Verify: true}, ""},
		{"written past the fork", mark(2, 0x5000100), 3, ends, checkpoint.Trust{Skip: 0x5000000, Lost: true, LostFrom: 0x5000000}, "past its end at 0/5000000"},
		{"written past an older fork", mark(1, 0x4000000), 3, ends, checkpoint.Trust{Skip: 0x3000060, Lost: true, LostFrom: 0x3000060}, "timeline 1 past its end at 0/3000060"},
		{"past the server's WAL: a restore", mark(1, 0x7000001), 1, nil, checkpoint.Trust{Lost: true}, "flushed up to 0/7000000"},
		{"at the server's WAL end", mark(3, 0x7000000), 3, ends, checkpoint.Trust{Verify: true}, ""},
		{"a timeline not in the history", mark(4, 0x100), 3, ends, checkpoint.Trust{}, "timeline 4, which is not in the history"},
		{"a sibling's timeline", mark(2, 0x100), 2, map[int32]pglogrepl.LSN{1: 0x50}, checkpoint.Trust{Verify: true}, ""},
		{"an older record", checkpoint.Mark{End: 0x100}, 1, nil, checkpoint.Trust{}, "older version"},
		{"an older record with a timeline only", checkpoint.Mark{End: 0x100, Timeline: 1}, 1, nil, checkpoint.Trust{}, "older version"},
		{"naming no commit, past the server's WAL", checkpoint.Mark{End: 0x7000001, Timeline: 1}, 1, nil, checkpoint.Trust{Lost: true}, "names no commit, lies past the server's WAL"},
		{"an older record past the server's WAL", checkpoint.Mark{End: 0x7000001}, 1, nil, checkpoint.Trust{Lost: true}, "names no commit, lies past the server's WAL"},
		{"naming no commit, past the fork", checkpoint.Mark{End: 0x5000100, Timeline: 2}, 3, ends, checkpoint.Trust{Lost: true, LostFrom: 0x5000000}, "names no commit, was written on timeline 2 past its end"},
		{"naming no commit, before the fork", checkpoint.Mark{End: 0x4000000, Timeline: 2}, 3, ends, checkpoint.Trust{}, "older version"},
	} {
		got := checkpoint.Decide(c.m, c.timeline, c.ends, 0x7000000)
		why := got.Why
		got.Why = ""
		if got != c.want || !strings.Contains(why, c.why) || (c.why == "") != (why == "") {
			t.Errorf("%s: Decide = %+v (%q), want %+v (%q)", c.name, got, why, c.want, c.why)
		}
	}
}

// TestMarkIs: a commit is the mark's only when its end LSN, xid and commit
// time all match; a restored cluster reuses xids and LSNs, not the clock.
func TestMarkIs(t *testing.T) {
	m := checkpoint.Mark{End: 0x500, Timeline: 1, Xid: 740, CommitTime: committed}
	for _, c := range []struct {
		end  pglogrepl.LSN
		xid  uint32
		at   time.Time
		want bool
	}{
		{0x500, 740, committed, true},
		{0x500, 740, committed.In(time.FixedZone("x", 3600)), true}, // the same instant
		{0x500, 741, committed, false},
		{0x500, 740, committed.Add(time.Microsecond), false},
		{0x508, 740, committed, false},
	} {
		if got := m.Is(c.end, c.xid, c.at); got != c.want {
			t.Errorf("Is(%s, %d, %s) = %v", c.end, c.xid, c.at, got)
		}
	}
	if (checkpoint.Mark{End: 0x500}).Is(0x500, 0, time.Time{}) {
		t.Error("a mark that names no commit matched")
	}
}

// TestHoldStopsKeepalivesOnly: while held, a keepalive moves nothing; a
// committed transaction still does. Newest is the newest commit's end.
func TestHoldStopsKeepalivesOnly(t *testing.T) {
	tr := checkpoint.New(100)
	tr.Hold(true)
	if tr.Idle(900) || tr.Confirmed() != 100 {
		t.Fatalf("a keepalive moved a held position to %s", tr.Confirmed())
	}
	tx := tr.Begin(committed)
	tr.Add(tx, 1)
	tr.Commit(tx, 300)
	if tr.Newest() != 300 || tr.Confirmed() != 100 {
		t.Fatalf("newest %s, confirmed %s; want 0/12C and 0/64", tr.Newest(), tr.Confirmed())
	}
	tr.Ack(tx)
	if tr.Confirmed() != 300 {
		t.Fatalf("a committed transaction did not move a held position: %s", tr.Confirmed())
	}
	tr.Hold(false)
	if !tr.Idle(900) || tr.Confirmed() != 900 || tr.Newest() != 900 {
		t.Fatalf("after Hold(false): confirmed %s, newest %s", tr.Confirmed(), tr.Newest())
	}
}

// TestMarkIsNamed: a checkpoint past the last commit (at a lone message's
// dead-letter record) names that commit where it ends, before the
// checkpoint's position: that is the commit it is verified by.
func TestMarkIsNamed(t *testing.T) {
	m := checkpoint.Mark{End: 0x580, Named: 0x500, Timeline: 1, Xid: 740, CommitTime: committed}
	if !m.Is(0x500, 740, committed) {
		t.Error("the named commit, ending before the checkpoint, is not the mark's")
	}
	if m.Is(0x580, 740, committed) {
		t.Error("a commit at the checkpoint's position is taken for the named one")
	}
}
