package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// slotWait bounds the waits for a slot: far above what a walsender takes
// to exit on a loaded machine (well under a second), far below the test
// timeout.
const slotWait = time.Minute

// WaitSlotInactive waits until no process holds the replication slot, and
// fails the test, saying who held it last, if that takes longer than a
// minute.
//
// A client that stopped streaming (it exited, was killed, or closed its
// connection) has not yet released the slot when it is gone: its walsender
// still has to read the client's last status update, store the confirmed
// position in the slot, notice the end of the connection and exit. Until
// then pg_replication_slots may show the slot active and an older
// confirmed_flush_lsn, and pg_drop_replication_slot fails with "replication
// slot ... is active for PID ...". Once the slot is inactive, both are
// final: the walsender processed everything the client sent before it
// released the slot. So a test that reads or drops a slot after stopping the
// streamer calls this first.
func WaitSlotInactive(t testing.TB, url, slot string) {
	t.Helper()
	if err := waitSlotInactive(url, slot); err != nil {
		t.Fatal(err)
	}
}

func waitSlotInactive(url, slot string) error {
	ctx, cancel := context.WithTimeout(context.Background(), slotWait)
	defer cancel()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	var last string
	for {
		// A fault test may have restarted the server: reconnect as needed.
		if conn == nil || conn.IsClosed() {
			c, err := pgx.Connect(ctx, url)
			if err == nil {
				conn = c
			} else {
				last = fmt.Sprintf("cannot connect: %v", err)
			}
		}
		if conn != nil && !conn.IsClosed() {
			seen, inactive, err := slotHolder(ctx, conn, slot)
			switch {
			case err != nil:
				last = err.Error()
			case inactive:
				return nil
			default:
				last = seen
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replication slot %q still not released by its walsender after %s; last seen: %s", slot, slotWait, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// errSlotMissing is what slotHolder says of a slot that is not there: a
// test waiting for it to be released expected it to exist.
var errSlotMissing = errors.New("the slot does not exist")

// slotHolder reads whether the slot is inactive and, when it is not, who
// holds it.
func slotHolder(ctx context.Context, conn *pgx.Conn, slot string) (seen string, inactive bool, err error) {
	var active bool
	var pid *int32
	var backend, state, wait string
	err = conn.QueryRow(ctx, `SELECT s.active, s.active_pid, coalesce(a.backend_type, ''), coalesce(a.state, ''),
			coalesce(a.wait_event_type || '/' || a.wait_event, '')
		FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
		WHERE s.slot_name = $1`, slot).Scan(&active, &pid, &backend, &state, &wait)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, fmt.Errorf("slot %q: %w", slot, errSlotMissing)
	}
	if err != nil {
		return "", false, fmt.Errorf("read pg_replication_slots: %w", err)
	}
	if !active {
		return "", true, nil
	}
	seen = "active"
	if pid != nil {
		seen = fmt.Sprintf("active for PID %d (%s, state %q, waiting on %q)", *pid, backend, state, wait)
	}
	return seen, false, nil
}

// DropSlot waits until the slot is released (WaitSlotInactive), then drops
// it.
func DropSlot(t testing.TB, url, slot string) {
	t.Helper()
	WaitSlotInactive(t, url, slot)
	Exec(t, url, `SELECT pg_drop_replication_slot($1)`, slot)
}

// TerminateAndDropSlot drops a slot from under a client that is streaming
// from it: it ends the walsender that holds the slot, waiting for it to
// exit, and drops the slot. A client that reconnects at once can take the
// slot again in between; then it tries again, for up to a minute.
func TerminateAndDropSlot(t testing.TB, url, slot string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), slotWait)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	for {
		_, err = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots
			WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		if err == nil {
			_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
		}
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			return
		case !errors.As(err, &pgErr) || pgErr.Code != "55006": // object_in_use: taken again
			t.Fatalf("drop replication slot %q: %v", slot, err)
		case ctx.Err() != nil:
			t.Fatalf("drop replication slot %q: its client kept taking it again for %s: %v", slot, slotWait, err)
		}
	}
}

// PendingInserts returns what the slot streams next for inserts into table
// (schema.table): one line per row, in test_decoding's text ("table
// public.outbox: INSERT: id[bigint]:7 ..."), oldest first. Call it once the
// slot is inactive (WaitSlotInactive).
//
// It is the exact answer to "what did the streamer confirm": PostgreSQL
// skips a transaction on the next start only when its commit lies before
// the slot's confirmed_flush_lsn, and that position may lie inside a
// transaction that is not confirmed at all (a keepalive reports how far the
// walsender read, and it reads other databases' WAL and unfinished
// transactions too). So comparing confirmed_flush_lsn with a WAL position
// taken by the test says little; the rows the slot would send say it all.
// They are read from a temporary copy of the slot decoded with
// test_decoding, which needs no publication, so the slot itself stays as
// it was.
func PendingInserts(t testing.TB, url, slot, table string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*slotWait)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background()) // drops the temporary copy
	copied := Name("peek")
	if _, err := conn.Exec(ctx, `SELECT pg_copy_logical_replication_slot($1, $2, true, 'test_decoding')`, slot, copied); err != nil {
		t.Fatalf("copy replication slot %q to read what it streams next: %v", slot, err)
	}
	rows, err := conn.Query(ctx, `SELECT data FROM pg_logical_slot_peek_changes($1, NULL, NULL) WHERE starts_with(data, $2)`,
		copied, "table "+table+": INSERT: ")
	if err != nil {
		t.Fatalf("read what replication slot %q streams next: %v", slot, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("read what replication slot %q streams next: %v", slot, err)
	}
	return lines
}

// WaitSlotSynced waits until the standby at url holds a copy of the
// logical replication slot that a promotion keeps, at least as far as lsn
// (confirmed_flush_lsn), and fails the test with what it saw last after a
// minute.
//
// PostgreSQL 17's slot synchronization copies a failover slot from the
// primary periodically, and keeps the copy temporary (dropped at promotion)
// until the standby has replayed past the slot's restart point; a
// promotion before that loses the slot. So a test that fails over with a
// slot in it waits for synced, not temporary, and caught up.
func WaitSlotSynced(t testing.TB, url, slot, lsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), slotWait)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect to the standby: %v", err)
	}
	defer conn.Close(context.Background())
	last := "no row"
	for {
		var synced, temporary bool
		var confirmed string
		var ok bool
		err := conn.QueryRow(ctx, `SELECT coalesce((to_jsonb(s)->>'synced')::bool, false), temporary,
				coalesce(confirmed_flush_lsn::text, ''), coalesce(confirmed_flush_lsn >= $2::pg_lsn, false)
			FROM pg_replication_slots s WHERE slot_name = $1`, slot, lsn).Scan(&synced, &temporary, &confirmed, &ok)
		switch {
		case err == nil:
			last = fmt.Sprintf("synced=%v temporary=%v confirmed_flush_lsn=%s", synced, temporary, confirmed)
			if synced && !temporary && ok {
				return
			}
		case !errors.Is(err, pgx.ErrNoRows):
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("slot %s on the standby not synchronized up to %s within %s; last seen: %s", slot, lsn, slotWait, last)
		case <-time.After(100 * time.Millisecond): // the poll's period
		}
	}
}
