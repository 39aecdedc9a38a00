package pipeline

import (
	"errors"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
)

// recordedLineage is a Lineage that keeps what it is told.
type recordedLineage struct {
	epochs checkpoint.Epochs
	begun  []checkpoint.Epoch
	err    error
}

func (l *recordedLineage) Begin(e checkpoint.Epoch) (checkpoint.Epochs, error) {
	if l.err != nil {
		return nil, l.err
	}
	l.begun = append(l.begun, e)
	l.epochs, _, _ = l.epochs.Begin(e)
	return l.epochs, nil
}

// TestEpochSources: a transaction committed before the epoch's start
// keeps the outbox's source, one from it on carries the epoch's; the
// outbox's stats say the source it is published under now.
func TestEpochSources(t *testing.T) {
	p, _, s := newTestPipeline(t, Fail, 100)
	const base = "urn:test:outbox"
	p.reg.entries[0].Source = base
	p.SetEpochs(checkpoint.Epochs{{N: 1, Timeline: 2, From: 600}})
	if err := feed(t, p, relationMsg(), beginMsg(492), row("1", "payment"), commitMsg(500), beginMsg(692), row("2", "payment"), commitMsg(700)); err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 2 {
		t.Fatalf("%d records, want 2", len(s.records))
	}
	if got := header(s.records[0], "source"); got != base {
		t.Errorf("before the epoch: source %q, want the outbox's %q", got, base)
	}
	want := checkpoint.Source(base, 1)
	if got := header(s.records[1], "source"); got != want {
		t.Errorf("in epoch 1: source %q, want %q", got, want)
	}
	if p.Epoch() != 1 || p.Outboxes()[0].Source != want {
		t.Errorf("Epoch %d, the outbox's source %q; want 1, %q", p.Epoch(), p.Outboxes()[0].Source, want)
	}
	// Read again from before the epoch (a reconnect): the first
	// transaction is of the first history again, with its source.
	p.Lost()
	if err := feed(t, p, beginMsg(492), row("1", "payment"), commitMsg(500)); err != nil {
		t.Fatal(err)
	}
	if got := header(s.records[len(s.records)-1], "source"); got != base {
		t.Errorf("read again: source %q, want %q", got, base)
	}
}

// TestRefutedCheckpointBeginsAnEpoch: a Kafka checkpoint that is not on
// the server's history (a restore) is a lost history. An epoch is begun
// for it before anything is published again, from the start of the
// stream, and every event read again carries the epoch's source; without
// the record, the stream stops.
func TestRefutedCheckpointBeginsAnEpoch(t *testing.T) {
	p, _, s := newExactlyOnce(t, 0, 100)
	p.reg.entries[0].Source = "urn:test:outbox"
	l := &recordedLineage{}
	p.cfg.Lineage = l
	p.Verify(mark(600, 60))
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	err := feed(t, p, append(vtx(500, 50, "1", "2"), vtx(600, 99, "3")...)...)
	var ue *UnverifiedError
	if !errors.As(err, &ue) {
		t.Fatalf("err = %v, want an *UnverifiedError", err)
	}
	if len(l.begun) != 1 {
		t.Fatalf("%d epochs begun, want 1", len(l.begun))
	}
	if e := l.begun[0]; e.From != 0 || e.LostTo != 600 || e.LostTimeline != 1 || e.LostEpoch != 0 {
		t.Fatalf("epoch begun: %+v; want from 0, lost to 0/258 of timeline 1, epoch 0", e)
	}
	p.Lost()
	feedTx(t, p, vtx(500, 50, "1", "2"), vtx(600, 99, "3"))
	want := "urn:test:outbox/epoch-1"
	if len(s.records) != 3 {
		t.Fatalf("read again: %d records, want 3", len(s.records))
	}
	for _, r := range s.records {
		if got := header(r, "source"); got != want {
			t.Fatalf("event %s read again has source %q, want %q", eventID(r), got, want)
		}
	}

	p2, _, s2 := newExactlyOnce(t, 0, 100)
	p2.cfg.Lineage = &recordedLineage{err: errors.New("broker gone")}
	p2.Verify(mark(600, 60))
	if err := feed(t, p2, relationMsg()); err != nil {
		t.Fatal(err)
	}
	err = feed(t, p2, append(vtx(500, 50, "1"), vtx(700, 70, "2")...)...)
	if err == nil || errors.As(err, &ue) || len(s2.records) != 0 {
		t.Fatalf("the epoch not recorded: err %v, %d records; want the recorder's error and none", err, len(s2.records))
	}
}

// TestEpochBeforeTheFirstTransaction: a stream that takes the slot after
// an epoch began reports that epoch before its first transaction, which
// the published record then names: epoch 0 there would make a later
// restore that loses this epoch look like the one epoch 1 stands for.
func TestEpochBeforeTheFirstTransaction(t *testing.T) {
	p, _, _ := newTestPipeline(t, Fail, 100)
	p.SetEpochs(checkpoint.Epochs{{N: 1, Timeline: 1}, {N: 2, Timeline: 1, From: 50}})
	if got := p.Epoch(); got != 2 {
		t.Fatalf("epoch %d before the first transaction at 0/64, want 2", got)
	}
}
