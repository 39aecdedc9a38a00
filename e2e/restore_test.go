package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestRestoredUnderTheStream: PostgreSQL is put back from a copy of
// itself (a base backup started without recovery, as a volume snapshot
// would be) while cdc-outbox runs: the same system identifier and
// timeline, WAL that ends before the position cdc-outbox had confirmed.
// The running stream reconnects to it. Resumed at its confirmed position,
// it would skip every transaction the restored server commits below that
// position and write the position into the slot: the rows written after
// the restore would be lost without a word. It stops instead, recording
// the lost history, and the restart streams every row of the restored
// server, none under the source of a lost event.
func TestRestoredUnderTheStream(t *testing.T) {
	for _, delivery := range []string{"at-least-once", "exactly-once"} {
		t.Run(delivery, func(t *testing.T) { restoredUnderTheStream(t, delivery) })
	}
}

func restoredUnderTheStream(t *testing.T, delivery string) {
	began := time.Now()
	ctx := testenv.Context(t)
	old := testenv.Cluster(t, testenv.ClusterOptions{})
	// The copy: a standby, stopped, later started without standby.signal.
	backup := old.Standby("backup_1", testenv.ClusterOptions{})
	// cdc-outbox reaches the server through via, which forwards to the
	// restored server once it is in the old one's place.
	via := testenv.NewProxy(t, "127.0.0.1:0", hostPort(t, old.URL))
	e := newEnvAt(t, old.URL)
	e.runURL = "postgres://postgres@" + via.Addr() + "/postgres?sslmode=disable"
	flags := []string{"--delivery", delivery, "--slot-failover=false"}
	readCommitted := delivery == "exactly-once"
	var level []kgo.Opt
	if readCommitted {
		level = append(level, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	wl := newWorkload(e)
	st := e.start(flags...)
	e.waitStreaming()
	if err := wl.write(ctx, 1, 200, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	var copied string
	if err := e.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&copied); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the copy to replay up to "+copied, func() bool {
		var ok bool
		conn := testenv.Connect(t, backup.URL)
		defer conn.Close(context.Background())
		return conn.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, copied).Scan(&ok) == nil && ok
	})
	backup.Control("stop")

	// The old server goes on; cdc-outbox confirms far past the copy's WAL:
	// farther than the restored server's 300 rows below reach, on every
	// major (their WAL differs).
	if err := wl.write(ctx, 2, 2000, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	if v, _ := wl.verify([]string{"payment"}, 2*time.Minute, level...); v.missing != 0 {
		t.Fatalf("before the restore: %s", v)
	}
	var end string
	if err := e.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the slot to be confirmed up to "+end, func() bool {
		c, _ := e.slotLSNs()
		want, _ := pglogrepl.ParseLSN(end)
		return pglogrepl.LSN(c) >= want
	})
	confirmed, _ := pglogrepl.ParseLSN(end)
	e.streamIdentity() // read while the old server runs; the copy has the same
	old.Control("kill")

	// The copy in the old server's place, with a slot made at once (a
	// copy taken of a running server holds its slots; a base backup
	// does not).
	if err := os.Remove(filepath.Join(backup.DataDir, "standby.signal")); err != nil {
		t.Fatal(err)
	}
	backup.Control("start")
	pool, err := pgxpool.New(ctx, backup.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.pool, e.url = pool, backup.URL
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, e.slot); err != nil {
		t.Fatal(err)
	}
	// Rows the restored server commits below the confirmed position.
	if err := wl.write(ctx, 3, 300, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	var below bool
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() < $1::pg_lsn`, confirmed.String()).Scan(&below); err != nil {
		t.Fatal(err)
	}
	if !below {
		t.Fatalf("the restored server's WAL reached the confirmed position %s: the test needs its rows below it", confirmed)
	}
	via.Retarget(hostPort(t, backup.URL))
	if err := st.exited(2 * time.Minute); err == nil {
		t.Fatalf("the stream went on on the restored server:\n%s", tailOf(st.logText(), 3000))
	}
	log := st.logText()
	for _, w := range []string{"the server's WAL ends before what the stream read from it", `"msg":"lost history recorded`} {
		if !strings.Contains(log, w) {
			t.Fatalf("the stream does not say %q:\n%s", w, tailOf(log, 3000))
		}
	}

	st = e.start(flags...)
	e.waitStreaming()
	if err := wl.write(ctx, 4, 100, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	c := countHistories(t, e, readCommitted)
	t.Logf("restored under the stream, %s: confirmed %s before the restore; %s; %s in all", delivery, confirmed, c, time.Since(began).Round(time.Second))
	if c.missing != 0 {
		t.Fatalf("%d events of the restored server are not in Kafka", c.missing)
	}
	if c.collisions != 0 {
		t.Fatalf("%d events of the restored server share source and id with an event of the lost history", c.collisions)
	}
	if n := metricValue(t, st, "cdc_outbox_history_epoch"); n != 1 {
		t.Fatalf("cdc_outbox_history_epoch = %v after the restore, want 1", n)
	}
	st.stop()
}

// TestStandbyReadsTheLineageAtTakeover: a hot standby waits for the slot
// while the active instance streams, and meanwhile a lost history is
// recorded for the stream (as the active instance does when it meets a
// failover past the fork, just before it exits). The standby takes the
// slot when the active one dies: it must read the epochs then, not use
// what it read when it started, or it publishes the new history's events
// under the lost one's source.
func TestStandbyReadsTheLineageAtTakeover(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	active := e.start()
	e.waitStreaming()
	standby := e.startStandby()
	wl := newWorkload(e)
	if err := wl.write(ctx, 0, 50, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.check([]string{"payment"}, "before the takeover")

	// A lost history recorded while the standby waits: every commit from
	// 0/0 on timeline 1 is epoch 1's.
	stream := e.streamIdentity()
	records, err := sink.NewStreamRecords(sink.Config{Brokers: e.brokers}, "cdc_outbox.checkpoints")
	if err != nil {
		t.Fatal(err)
	}
	defer records.Close()
	es, _, _ := checkpoint.Epochs(nil).Begin(checkpoint.Epoch{Timeline: 1, LostTimeline: 1, LostTo: 0x1000000, At: time.Now()})
	if err := records.Write(ctx, sink.EpochsKey(stream), es.Encode()); err != nil {
		t.Fatal(err)
	}
	active.kill()
	eventually(t, time.Minute, "the standby to take the slot", func() bool {
		return strings.Contains(standby.logText(), `"msg":"streaming"`)
	})
	wl.mu.Lock()
	before := map[string]bool{}
	for _, ev := range wl.events {
		before[ev.id] = true
	}
	wl.mu.Unlock()
	if err := wl.write(ctx, 1, 50, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	v, got := wl.verify([]string{"payment"}, 2*time.Minute)
	if v.missing != 0 {
		t.Fatalf("after the takeover: %s", v)
	}
	var base, epoch1 int
	for id, ds := range got {
		if before[id] {
			continue
		}
		for _, d := range ds {
			if strings.HasSuffix(header(d.rec, "source"), "/epoch-1") {
				epoch1++
			} else {
				base++
			}
		}
	}
	t.Logf("after the takeover: %d events under /epoch-1, %d under the first history's source", epoch1, base)
	if base != 0 || epoch1 == 0 {
		t.Fatalf("the standby published %d events of the new history under the lost history's source (%d under /epoch-1)", base, epoch1)
	}
	standby.stop()
}
