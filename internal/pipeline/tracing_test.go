package pipeline

import (
	"errors"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"
)

// fakeTracer records the spans the pipeline starts and ends.
type fakeTracer struct {
	started []string // event ids
	ended   map[string][]error
}

func (f *fakeTracer) Start(rec *kgo.Record, eventID, _ string, lsn pglogrepl.LSN, commitUnixNano int64) func(*kgo.Record, error) {
	f.started = append(f.started, eventID)
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "traceparent", Value: []byte("span-" + eventID)})
	return func(_ *kgo.Record, err error) { f.ended[eventID] = append(f.ended[eventID], err) }
}

// TestTracerSpansEveryEventOnce: each event's span starts when it is
// produced and ends once, with the broker's first answer (a record refused
// in a batch and sent again alone is not traced twice); dead-letter
// records get none.
func TestTracerSpansEveryEventOnce(t *testing.T) {
	p, _, s := newTestPipeline(t, DeadLetter, 100)
	tr := &fakeTracer{ended: map[string][]error{}}
	p.cfg.Tracer = tr
	if err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment"), row("2", "payment"), insertMsg("3", "payment", "", "X", "{}", "\x00", "2026-12-01 00:00:00+00"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	if len(tr.started) != 2 || len(s.records) != 3 {
		t.Fatalf("spans started for %v, %d records produced; want events 1 and 2 (3 is a dead letter)", tr.started, len(s.records))
	}
	if header(s.records[0], "traceparent") != "span-1" {
		t.Errorf("record 1 carries traceparent %q, not its span's", header(s.records[0], "traceparent"))
	}
	refused := errors.New("refused")
	p.ack(s.records[0], nil)
	p.ack(s.records[1], refused)
	p.ack(s.records[1], nil)
	p.ack(s.records[2], nil)
	if len(tr.ended["1"]) != 1 || tr.ended["1"][0] != nil || len(tr.ended["2"]) != 1 || tr.ended["2"][0] != refused {
		t.Errorf("spans ended %v", tr.ended)
	}
}

// TestNoTracerNoAllocation: without a tracer an insert allocates only
// what it did before tracing: the pending record, its bytes, its headers.
func TestNoTracerNoAllocation(t *testing.T) {
	p, _, s := newTestPipeline(t, Fail, 1<<30)
	if err := feed(t, p, relationMsg(), beginMsg(500)); err != nil {
		t.Fatal(err)
	}
	msg := row("1", "payment")
	base := testing.AllocsPerRun(200, func() {
		if err := p.WAL(1000, msg); err != nil {
			t.Fatal(err)
		}
	})
	// The pending record, the one buffer of its bytes, its headers.
	if base != 3 {
		t.Errorf("an untraced insert allocates %v times, want 3", base)
	}
	s.records = nil
	tr := &fakeTracer{ended: map[string][]error{}}
	p.cfg.Tracer = tr
	traced := testing.AllocsPerRun(200, func() {
		if err := p.WAL(1000, msg); err != nil {
			t.Fatal(err)
		}
	})
	if traced <= base {
		t.Errorf("traced inserts allocate %v times, untraced %v: the check measures nothing", traced, base)
	}
	t.Logf("allocations per insert: %v untraced, %v with a tracer", base, traced)
}
