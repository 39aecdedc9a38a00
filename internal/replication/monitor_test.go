package replication

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// TestLogWALStatus: a change of wal_status is logged once, at the level
// the new state deserves, and a slot that recovers says so.
func TestLogWALStatus(t *testing.T) {
	for _, tc := range []struct {
		prev, now string
		reason    string
		want      string // "" for nothing logged
	}{
		{"", "reserved", "", ""},
		{"reserved", "reserved", "", ""},
		{"reserved", "extended", "", "level=WARN msg=\"the slot holds more WAL than max_wal_size"},
		{"extended", "unreserved", "", "level=ERROR msg=\"the slot holds more WAL than max_slot_wal_keep_size allows"},
		{"unreserved", "reserved", "", "level=INFO msg=\"the slot's WAL is within max_wal_size again"},
		{"unreserved", "lost", "", "level=ERROR msg=\"the slot is invalidated: PostgreSQL removed WAL the slot still needed"},
		{"reserved", "lost", "idle_timeout", "idle_replication_slot_timeout"},
		{"reserved", "lost", "", "cdc-outbox stops when the stream ends, saying how to recover"},
	} {
		var out bytes.Buffer
		logWALStatus(slog.New(slog.NewTextHandler(&out, nil)), tc.prev, SlotInfo{Name: "s", WALStatus: tc.now, InvalidationReason: tc.reason})
		switch got := out.String(); {
		case tc.want == "" && got != "":
			t.Errorf("%s → %s: logged %s", tc.prev, tc.now, got)
		case tc.want != "" && !strings.Contains(got, tc.want):
			t.Errorf("%s → %s: logged %q, want %q", tc.prev, tc.now, got, tc.want)
		case tc.want != "" && !strings.Contains(got, "slot=s wal_status="+tc.now+" previous="+tc.prev):
			t.Errorf("%s → %s: the log lacks the slot and its states: %s", tc.prev, tc.now, got)
		}
	}
}

// slotState is what a SlotObserver was told last.
type slotState struct {
	calls     int
	active    bool
	retained  int64
	walStatus string
}

func (s *slotState) Slot(active bool, retained int64, walStatus string) {
	s.calls++
	s.active, s.retained, s.walStatus = active, retained, walStatus
}

func (s *slotState) SlotFailover(bool, bool, map[string]string) {}
func (s *slotState) StandbySlotsBlocking(int)                   {}

// TestMonitor reads a real slot and publication: the slot's state reaches
// the observer, a publication that loses the outbox makes it unpublished
// (and says so), and a missing slot reads as inactive and holding nothing.
func TestMonitor(t *testing.T) {
	t.Parallel()
	url := testenv.Database(t)
	slot := testenv.Name("slot")
	testenv.Exec(t, url, `CREATE TABLE outbox (`+outboxColumns+`); CREATE PUBLICATION p FOR TABLE outbox WITH (publish = 'insert')`)
	testenv.Exec(t, url, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	t.Cleanup(func() { testenv.Exec(t, url, `SELECT pg_drop_replication_slot($1)`, slot) })
	table := pgname.Name{Schema: "public", Relation: "outbox"}
	tab, err := FindTable(testenv.Context(t), testenv.Connect(t, url), table)
	if err != nil {
		t.Fatal(err)
	}

	var obs slotState
	var logs bytes.Buffer
	m := NewMonitor(MonitorConfig{URL: url, Slot: slot, Publication: "p", Table: table, Outbox: tab.Relation}, &obs, slog.New(slog.NewTextHandler(&logs, nil)))
	defer m.close()
	ctx := testenv.Context(t)

	m.check(ctx)
	if obs.calls != 1 || obs.active || obs.walStatus != "reserved" || !m.Published() {
		t.Fatalf("a reserved, inactive slot and a complete publication: observed %+v, published %v; log:\n%s", obs, m.Published(), logs.String())
	}

	testenv.Exec(t, url, `ALTER PUBLICATION p DROP TABLE outbox`)
	m.check(ctx)
	if m.Published() || !strings.Contains(logs.String(), `the outbox table is not in the publication, or not wholly`) ||
		!strings.Contains(logs.String(), `ALTER PUBLICATION \"p\" ADD TABLE \"public\".\"outbox\"`) {
		t.Fatalf("the outbox left the publication: published %v; log:\n%s", m.Published(), logs.String())
	}

	m.cfg.Slot = testenv.Name("missing")
	m.check(ctx)
	if obs.calls != 3 || obs.active || obs.retained != 0 || obs.walStatus != "" ||
		!strings.Contains(logs.String(), "could not read the replication slot's state") {
		t.Fatalf("a missing slot: observed %+v; log:\n%s", obs, logs.String())
	}
}

// activeState is what a SlotObserver was told last of the slot's activity,
// read while Run's goroutine writes it.
type activeState struct {
	calls  atomic.Int64
	active atomic.Bool
}

func (s *activeState) Slot(active bool, _ int64, _ string)        { s.active.Store(active); s.calls.Add(1) }
func (s *activeState) SlotFailover(bool, bool, map[string]string) {}
func (s *activeState) StandbySlotsBlocking(int)                   {}

// TestMonitorSeesStreamingSoon: the monitor's first read comes while the
// stream is still connecting and finds the slot inactive; it reads again
// every second until the slot is active, rather than a whole interval
// later, so metrics do not say "inactive" for the first interval after a
// start while events stream.
func TestMonitorSeesStreamingSoon(t *testing.T) {
	t.Parallel()
	url := testenv.Database(t)
	slot := testenv.Name("slot")
	testenv.Exec(t, url, `CREATE TABLE outbox (`+outboxColumns+`); CREATE PUBLICATION p FOR TABLE outbox WITH (publish = 'insert')`)
	testenv.Exec(t, url, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	t.Cleanup(func() { testenv.TerminateAndDropSlot(t, url, slot) })
	table := pgname.Name{Schema: "public", Relation: "outbox"}
	tab, err := FindTable(testenv.Context(t), testenv.Connect(t, url), table)
	if err != nil {
		t.Fatal(err)
	}

	var obs activeState
	m := NewMonitor(MonitorConfig{URL: url, Slot: slot, Publication: "p", Table: table, Outbox: tab.Relation, Interval: time.Minute},
		&obs, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(testenv.Context(t))
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(30 * time.Second)
	for obs.calls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the monitor did not read the slot within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if obs.active.Load() {
		t.Fatal("the slot read active before anything streamed from it")
	}

	cfg, err := ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(testenv.Context(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := pglogrepl.StartReplication(testenv.Context(t), conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'p'"}}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second) // the interval is a minute
	for !obs.active.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("the slot was streamed from, but the monitor still says inactive after 10s (%d reads)", obs.calls.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
