package checkpoint_test

import (
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
)

// TestEpochsAt: a commit belongs to the newest epoch that began at or
// before it; before the first, to the first history (0). An epoch whose
// start is not known (0, a restore) takes every commit from then on.
func TestEpochsAt(t *testing.T) {
	es := checkpoint.Epochs{
		{N: 1, Timeline: 2, From: 0x3000060},
		{N: 2, Timeline: 3, From: 0x5000000},
	}
	for _, c := range []struct {
		commit pglogrepl.LSN
		want   int
	}{
		{0, 0}, {0x300005F, 0}, {0x3000060, 1}, {0x4FFFFFF, 1}, {0x5000000, 2}, {0x9000000, 2},
	} {
		if got := es.At(c.commit); got != c.want {
			t.Errorf("At(%s) = %d, want %d", c.commit, got, c.want)
		}
	}
	if got := (checkpoint.Epochs{}).At(0x5000000); got != 0 {
		t.Errorf("no epochs: At = %d, want 0", got)
	}
	restored := append(es, checkpoint.Epoch{N: 3, Timeline: 3, From: 0})
	for _, lsn := range []pglogrepl.LSN{0, 0x3000060, 0x9000000} {
		if got := restored.At(lsn); got != 3 {
			t.Errorf("after a restore, At(%s) = %d, want 3", lsn, got)
		}
	}
}

// TestEpochsBegin: a lost history found again (after a restart: the same
// fork of the same epoch) keeps its number, and only its lost range grows;
// another one (another fork, or a loss of the epoch that followed) is the
// next number.
func TestEpochsBegin(t *testing.T) {
	fork := checkpoint.Epoch{Timeline: 2, From: 0x3000060, LostTimeline: 1, LostFrom: 0x3000060, LostTo: 0x3100000}
	es, e, changed := checkpoint.Epochs(nil).Begin(fork)
	if !changed || e.N != 1 || len(es) != 1 {
		t.Fatalf("first lost history: epoch %d, changed %v, %d epochs; want 1, true, 1", e.N, changed, len(es))
	}

	// The restart reads a checkpoint short of what the stream published.
	again := fork
	again.LostTo = 0x3080000
	es2, e, changed := es.Begin(again)
	if changed || e.N != 1 || e.LostTo != 0x3100000 || len(es2) != 1 {
		t.Fatalf("found again: epoch %d lost to %s, changed %v, %d epochs; want 1, 0/3100000, false, 1", e.N, e.LostTo, changed, len(es2))
	}
	further := fork
	further.LostTo = 0x3200000
	es3, e, changed := es.Begin(further)
	if !changed || e.N != 1 || es3[0].LostTo != 0x3200000 || es[0].LostTo != 0x3100000 {
		t.Fatalf("found with more lost: epoch %d, changed %v, lost to %s (before: %s); want 1, true, 0/3200000, unchanged", e.N, changed, es3[0].LostTo, es[0].LostTo)
	}

	// A restore of the new history loses epoch 1's events: a new epoch,
	// though the timelines are the same as another's.
	restore := checkpoint.Epoch{Timeline: 2, From: 0, LostEpoch: 1, LostTimeline: 2, LostTo: 0x4000000}
	es4, e, changed := es.Begin(restore)
	if !changed || e.N != 2 || len(es4) != 2 {
		t.Fatalf("a restore after: epoch %d, changed %v, %d epochs; want 2, true, 2", e.N, changed, len(es4))
	}
	if _, e, changed := es4.Begin(restore); changed || e.N != 2 {
		t.Fatalf("the restore found again: epoch %d, changed %v; want 2, false", e.N, changed)
	}
}

// TestEpochSource: the first history keeps the source as it was; each
// epoch's differs from every other's.
func TestEpochSource(t *testing.T) {
	base := "7301234567890123456/16384/16385"
	if got := checkpoint.Source(base, 0); got != base {
		t.Errorf("Source(base, 0) = %q, want %q", got, base)
	}
	seen := map[string]bool{base: true}
	for n := 1; n <= 12; n++ {
		s := checkpoint.Source(base, n)
		if seen[s] {
			t.Fatalf("Source(base, %d) = %q, the source of another epoch", n, s)
		}
		seen[s] = true
	}
	if got, want := checkpoint.Source("urn:payments:outbox", 2), "urn:payments:outbox/epoch-2"; got != want {
		t.Errorf("Source = %q, want %q", got, want)
	}
}

// TestLostPast: what an at-least-once stream published is lost when it
// lies past the fork of the server's history, or past its WAL; on the
// server's own history within its WAL, or before the fork, it is not.
func TestLostPast(t *testing.T) {
	ends := map[int32]pglogrepl.LSN{1: 0x3000060}
	for _, c := range []struct {
		name     string
		p        checkpoint.Published
		timeline int32
		lost     bool
		from     pglogrepl.LSN
	}{
		{"none recorded", checkpoint.Published{}, 2, false, 0},
		{"same timeline, within the WAL", checkpoint.Published{End: 0x4000000, Timeline: 2}, 2, false, 0},
		{"before the fork", checkpoint.Published{End: 0x3000000, Timeline: 1}, 2, false, 0},
		{"at the fork", checkpoint.Published{End: 0x3000060, Timeline: 1}, 2, false, 0},
		{"past the fork", checkpoint.Published{End: 0x3100000, Timeline: 1}, 2, true, 0x3000060},
		{"past the WAL (a restore)", checkpoint.Published{End: 0x9000000, Timeline: 2}, 2, true, 0},
		{"a timeline not in the history", checkpoint.Published{End: 0x3100000, Timeline: 7}, 2, false, 0},
	} {
		lost, from := checkpoint.LostPast(c.p, c.timeline, ends, 0x5000000)
		if lost != c.lost || from != c.from {
			t.Errorf("%s: lost %v from %s, want %v from %s", c.name, lost, from, c.lost, c.from)
		}
	}
	p := checkpoint.Published{End: 0x3100000, Timeline: 1, Epoch: 2}
	if got, err := checkpoint.DecodePublished(p.Encode()); err != nil || got != p {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, p)
	}
	if got, err := checkpoint.DecodePublished(nil); err != nil || got != (checkpoint.Published{}) {
		t.Fatalf("no record: %+v, %v", got, err)
	}
}

// TestEpochsEncode: the epochs record reads back as written.
func TestEpochsEncode(t *testing.T) {
	es := checkpoint.Epochs{{N: 1, Timeline: 2, From: 0x3000060, LostTimeline: 1, LostFrom: 0x3000060, LostTo: 0x3100000, At: committed},
		{N: 2, Timeline: 2, LostEpoch: 1, LostTimeline: 2, LostTo: 0x4000000, At: committed}}
	got, err := checkpoint.DecodeEpochs(es.Encode())
	if err != nil || len(got) != 2 || got[0] != es[0] || got[1] != es[1] {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, es)
	}
	if got, err := checkpoint.DecodeEpochs(nil); err != nil || got != nil {
		t.Fatalf("no record: %+v, %v", got, err)
	}
	if _, err := checkpoint.DecodeEpochs([]byte(`{"epochs":[{"n":1,"from_lsn":"x"}]}`)); err == nil {
		t.Fatal("a bad LSN decoded")
	}
}

// TestEpochsLost: a checkpoint is of a lost history when an epoch records
// its epoch's WAL of its timeline as lost through its position.
func TestEpochsLost(t *testing.T) {
	es := checkpoint.Epochs{
		{N: 1, Timeline: 1, LostEpoch: 0, LostTimeline: 1, LostTo: 0x500},                               // a restore
		{N: 2, Timeline: 3, From: 0x800, LostEpoch: 1, LostTimeline: 2, LostFrom: 0x800, LostTo: 0x900}, // a failover
	}
	for _, c := range []struct {
		m    checkpoint.Mark
		want bool
	}{
		{checkpoint.Mark{End: 0x500, Timeline: 1}, true},
		{checkpoint.Mark{End: 0x501, Timeline: 1}, false},           // past what was lost: written later
		{checkpoint.Mark{End: 0x400, Timeline: 1, Epoch: 1}, false}, // the new history's
		{checkpoint.Mark{End: 0x880, Timeline: 2, Epoch: 1}, true},
		{checkpoint.Mark{End: 0x800, Timeline: 2, Epoch: 1}, false}, // at the fork: on both
		{checkpoint.Mark{End: 0x880, Timeline: 3, Epoch: 2}, false},
	} {
		if got := es.Lost(c.m); got != c.want {
			t.Errorf("Lost(%+v) = %v, want %v", c.m, got, c.want)
		}
	}
}
