package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/consume"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// defaultSource is the source header the streamer sets without --source:
// the outbox table's "<system identifier>/<database OID>/<table OID>".
func (e *env) defaultSource() string {
	e.t.Helper()
	var s string
	err := e.pool.QueryRow(testenv.Context(e.t), `SELECT (SELECT system_identifier FROM pg_control_system())::text
		|| '/' || (SELECT oid FROM pg_database WHERE datname = current_database())::text || '/' || 'public.outbox'::regclass::oid::text`).Scan(&s)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// TestTwoOutboxesOneGroup: two services, each with its own database and
// outbox (both number their events 1, 2, 3...), each streamed by its own
// cdc-outbox, one with the default source and one with --source (one of
// them SIGKILLed and restarted midway); one consumer group reads both
// topics and processes every event of both, once. Before sources, the
// second service's event n was skipped as a duplicate of the first's.
// Then the group is rewound to the start of both topics: every record
// comes again, and each is skipped as the duplicate it is.
func TestTwoOutboxesOneGroup(t *testing.T) {
	t.Parallel()
	payments, refunds := newEnv(t), newEnv(t)
	const refundsSource = "refunds-service"
	sp := payments.start()
	sr := refunds.start("--source", refundsSource)
	payments.waitStreaming()
	refunds.waitStreaming()

	// The consumer's own database.
	url := testenv.Database(t)
	applySQLFiles(t, url, "../sql/processed_events.sql")
	testenv.Exec(t, url, `CREATE TABLE work (source text NOT NULL, event_id text NOT NULL, topic text NOT NULL,
		UNIQUE (source, event_id))`)
	pool, err := pgxpool.New(testenv.Context(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	const n = 300
	ctx := testenv.Context(t)
	write := func(e *env, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := e.pool.Exec(ctx, insertEvent, "payment", fmt.Sprintf("agg-%d", i%13), `{}`, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(payments, 0, n/2)
	write(refunds, 0, n/2)
	sp.kill() // in flight events are sent again after the restart
	write(payments, n/2, n)
	write(refunds, n/2, n)
	sp = payments.start()

	var processed, duplicates atomic.Int64
	group := testenv.Name("grp")
	cfg := consume.Config{
		Brokers: payments.brokers,
		Group:   group,
		Topics:  []string{payments.topic("payment"), refunds.topic("payment")},
		DB:      pool,
		Handler: func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
			// UNIQUE (source, event_id): a second run for one event fails loudly.
			_, err := tx.Exec(ctx, `INSERT INTO work (source, event_id, topic) VALUES ($1, $2, $3)`,
				header(r, consume.HeaderSource), header(r, consume.HeaderEventID), r.Topic)
			return err
		},
		Hooks: consume.HooksFunc(func(o consume.Observation) {
			switch o.Outcome {
			case consume.Processed:
				processed.Add(1)
			case consume.Duplicate:
				duplicates.Add(1)
			}
		}),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	runUntil := func(what string, cond func() bool) {
		t.Helper()
		c, err := consume.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		runCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		eventually(t, 3*time.Minute, what, func() bool {
			select {
			case err := <-done:
				t.Fatalf("Run stopped: %v", err)
			default:
			}
			return cond()
		})
		stop()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	runUntil(fmt.Sprintf("the group to process the %d events of both outboxes", 2*n), func() bool { return processed.Load() >= 2*n })
	sp.stop()
	sr.stop()
	firstDuplicates := duplicates.Load()

	// Everything again: rewind the group to the start of both topics.
	adm := kadm.NewClient(testenv.KafkaClient(t))
	ends, err := adm.ListEndOffsets(ctx, cfg.Topics...)
	if err != nil {
		t.Fatal(err)
	}
	var rewind kadm.Offsets
	records := int64(0)
	ends.Each(func(o kadm.ListedOffset) {
		rewind.AddOffset(o.Topic, o.Partition, 0, -1)
		records += o.Offset
	})
	if err := adm.CommitAllOffsets(ctx, group, rewind); err != nil {
		t.Fatalf("rewind the group: %v", err)
	}
	runUntil(fmt.Sprintf("the group to skip all %d records again", records), func() bool { return duplicates.Load()-firstDuplicates >= records })

	var rows, perSource int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT source) FROM work`).Scan(&rows, &perSource); err != nil {
		t.Fatal(err)
	}
	t.Logf("processed=%d duplicates=%d (%d before the rewind) kafka_records=%d work_rows=%d sources=%d",
		processed.Load(), duplicates.Load(), firstDuplicates, records, rows, perSource)
	if processed.Load() != 2*n || rows != 2*n {
		t.Errorf("processed %d events into %d rows; want %d and %d: each outbox's %d", processed.Load(), rows, 2*n, 2*n, n)
	}
	got := queryPairs(t, pool, `SELECT source, count(*)::text FROM work GROUP BY source ORDER BY source`)
	want := [][2]string{{payments.defaultSource(), fmt.Sprint(n)}, {refundsSource, fmt.Sprint(n)}}
	slices.SortFunc(want, func(a, b [2]string) int {
		if a[0] < b[0] {
			return -1
		}
		return 1
	})
	if !slices.Equal(got, want) {
		t.Errorf("events per source %v, want %v", got, want)
	}
	// Both outboxes numbered their events from 1: the overlap is real.
	var overlap int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT event_id FROM work GROUP BY event_id HAVING count(*) = 2) x`).Scan(&overlap); err != nil {
		t.Fatal(err)
	}
	if overlap != n {
		t.Errorf("%d event ids processed from both sources, want all %d", overlap, n)
	}
}
