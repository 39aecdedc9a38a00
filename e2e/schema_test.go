package e2e

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestTableAlteredMidStream changes the outbox table while writers commit.
// pgoutput sends the new shape of the table before the first row written
// after the change, so the streamer keeps going: a new column is ignored, a
// dropped optional column is simply absent, and a table rewrite (a column
// changing type) republishes nothing.
func TestTableAlteredMidStream(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		setup string // before the streamer starts
		alter string // while the writers write
		// insert is the writers' statement, when the change needs them to
		// leave a column out.
		insert string
	}{
		{name: "column added", alter: `ALTER TABLE outbox ADD COLUMN tenant text NOT NULL DEFAULT 'acme'`},
		{name: "extra column dropped", setup: `ALTER TABLE outbox ADD COLUMN note text DEFAULT 'n'`, alter: `ALTER TABLE outbox DROP COLUMN note`},
		{name: "headers column dropped", alter: `ALTER TABLE outbox DROP COLUMN headers`,
			insert: `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT $1, $2, 'PaymentCreated', $3::jsonb WHERE $4::text IS NOT NULL RETURNING id`},
		{name: "payload retyped to text", alter: `ALTER TABLE outbox ALTER COLUMN payload TYPE text`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := testenv.Context(t)
			if c.setup != "" {
				testenv.Exec(t, e.url, c.setup)
			}
			s := e.start()
			e.waitStreaming()
			wl := newWorkload(e)
			if c.insert != "" {
				wl.insert = c.insert
			}
			writing := make(chan error, 2)
			for w := 0; w < 2; w++ {
				go func() { writing <- wl.write(ctx, w, 300, 5, "payment", false) }()
			}
			eventually(t, time.Minute, "events before the change", func() bool {
				wl.mu.Lock()
				defer wl.mu.Unlock()
				return len(wl.events) >= 100
			})
			testenv.Exec(t, e.url, c.alter)
			for w := 0; w < 2; w++ {
				if err := <-writing; err != nil {
					t.Fatalf("writer: %v", err)
				}
			}
			v, _ := wl.verify([]string{"payment"}, 2*time.Minute)
			t.Logf("verifier across %q: %s", c.alter, v)
			if v.missing != 0 || v.orderViolations != 0 || v.duplicates != 0 {
				t.Fatalf("verifier: %s; missing ids %v", v, v.missingIDs)
			}
			s.stop()
		})
	}
}

// TestRequiredColumnRenamed renames the aggregate id column under
// --on-bad-event=fail. The first row written after the rename lacks the
// configured column: the streamer stops on it, names the event, its LSN and
// the flag to change, and confirms everything before it but nothing past
// it: the slot's next rows are exactly those written after the rename.
// Restarted with the column flag pointing at the new name, it delivers
// that row and every one after it, and repeats none: a restart from
// further back would meet rows of the old shape, bad under the new flag.
// Position updates are made rare, so only the settling at the stop can
// confirm the rows before the rename.
func TestRequiredColumnRenamed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	s := e.start("--status-interval", "1h", "--keepalive-interval", "1h", "--receive-timeout", "0")
	e.waitStreaming()
	wl := newWorkload(e)
	if err := wl.write(ctx, 0, 100, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	if v, _ := wl.verify([]string{"payment"}, time.Minute); v.missing != 0 {
		t.Fatalf("before the rename: %s", v)
	}
	testenv.Exec(t, e.url, `ALTER TABLE outbox RENAME COLUMN aggregate_id TO aggregate_key`)
	wl.insert = strings.Replace(insertEvent, "aggregate_id", "aggregate_key", 1)
	if err := wl.write(ctx, 1, 100, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	if err := s.exited(time.Minute); err == nil {
		t.Fatal("the streamer exited 0 after the required column was renamed")
	}
	after := e.ids(`SELECT id::text FROM outbox WHERE aggregate_key LIKE 'w1-%' ORDER BY id`)
	first := after[0]
	log := strings.ReplaceAll(s.logText(), `\"`, `"`)
	for _, want := range []string{"bad event " + first + " at LSN ", `column "aggregate_id": is not a column of the outbox table; check the column flags`} {
		if !strings.Contains(log, want) {
			t.Fatalf("the error lacks %q:\n%s", want, log)
		}
	}
	if pending := e.pendingIDs(); !slices.Equal(pending, after) {
		t.Fatalf("the slot streams next the rows %v; want exactly the %d written after the rename, %v: "+
			"the rows before it confirmed, none after it", pending, len(after), after)
	}

	s = e.start("--column-aggregate-id", "aggregate_key")
	v, _ := wl.verify([]string{"payment"}, 2*time.Minute)
	t.Logf("verifier after restarting with the new column name: %s", v)
	if v.missing != 0 || v.orderViolations != 0 || v.duplicates != 0 {
		t.Fatalf("verifier: %s; missing ids %v", v, v.missingIDs)
	}
	s.stop()
}

// TestPublicationDropped drops the publication while the streamer runs.
// The server decodes each change with the catalog of its time, so it cannot
// decode past the drop, even once the publication is back: the streamer
// exits saying so and how to recover, confirming nothing past the drop
// (every row written after it is still among the slot's next rows).
// The recovery it gives then delivers every event: re-create the
// publication, drop the slot, start with --recreate-slot, and re-publish
// the rows the consumers have not seen with cdc-outbox republish.
func TestPublicationDropped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	s := e.start()
	e.waitStreaming()
	wl := newWorkload(e)
	if err := wl.write(ctx, 0, 100, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, e.url, `DROP PUBLICATION cdc_outbox`)
	if err := wl.write(ctx, 1, 100, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	if err := s.exited(time.Minute); err == nil {
		t.Fatal("the streamer exited 0 after its publication was dropped")
	}
	log := strings.ReplaceAll(s.logText(), `\"`, `"`)
	for _, want := range []string{`publication "cdc_outbox" does not exist`, "cannot stream past the drop", "pg_drop_replication_slot('" + e.slot + "')", "--recreate-slot", "re-publish"} {
		if !strings.Contains(log, want) {
			t.Fatalf("the error lacks %q:\n%s", want, log)
		}
	}
	after := e.ids(`SELECT id::text FROM outbox WHERE aggregate_id LIKE 'w1-%' ORDER BY id`)
	if pending := e.pendingIDs(); len(pending) < len(after) || !slices.Equal(pending[len(pending)-len(after):], after) {
		t.Fatalf("the slot streams next the rows %v; want all %d written after the drop, %v, last", pending, len(after), after)
	}

	testenv.Exec(t, e.url, `CREATE PUBLICATION cdc_outbox FOR TABLE outbox WITH (publish = 'insert')`)
	testenv.DropSlot(t, e.url, e.slot)
	s = e.start("--recreate-slot")
	e.waitStreaming()
	_, got := wl.verify([]string{"payment"}, 5*time.Second)
	seen := int64(0)
	for id := range got {
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seen = max(seen, n)
	}
	e.republish("--after-id", strconv.FormatInt(seen, 10))
	v, _ := wl.verify([]string{"payment"}, 2*time.Minute)
	t.Logf("verifier after the recovery (re-published after id %d): %s", seen, v)
	if v.missing != 0 || v.orderViolations != 0 {
		t.Fatalf("verifier: %s; missing ids %v", v, v.missingIDs)
	}
	s.stop()
}
