package replication

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// blockerReport is how often a slot creation that waits says who it waits
// for.
const blockerReport = 10 * time.Second

// createSlotWatched runs pg_create_logical_replication_slot on conn and
// returns the slot's start LSN as text; failover makes it a failover slot (17+).
//
// The function waits until every transaction running in the cluster when it
// started has ended (prepared ones included), to find a consistent point to
// decode from. A session left idle in transaction, or a forgotten PREPARE
// TRANSACTION, makes it wait forever, saying nothing. So while it waits, a
// second connection names the transactions it waits for every
// blockerReport; and if it is given up (ctx ends), that connection cancels
// the creating backend, which otherwise would go on waiting, holding the
// half-made slot, after this client has gone (and the next start would
// wait on it).
func createSlotWatched(ctx context.Context, conn *pgx.Conn, slot string, failover bool, log *slog.Logger) (string, error) {
	pid := conn.PgConn().PID()
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		watchSlotCreation(ctx, done, conn.Config().Copy(), pid, slot, log)
	}()
	create := `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`
	if failover {
		// Not temporary, no two-phase, failover (PostgreSQL 17+):
		// synchronized to standbys that have sync_replication_slots = on.
		create = `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`
	}
	var lsn string
	err := conn.QueryRow(ctx, create, slot).Scan(&lsn)
	close(done)
	<-watched
	if err != nil && ctx.Err() != nil {
		// Given up: the backend may still be waiting, holding the slot.
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if cerr := cancelCreation(cctx, conn.Config().Copy(), pid); cerr != nil {
			log.Warn("could not cancel the backend that creates the replication slot; cancel it yourself with SELECT pg_cancel_backend(pid)",
				"slot", slot, "pid", pid, "error", cerr)
		} else {
			log.Info("gave up creating the replication slot and cancelled its backend; nothing of it is left", "slot", slot, "pid", pid)
		}
	}
	return lsn, err
}

// watchSlotCreation reports what the creating backend pid waits for, every
// blockerReport, until done is closed or ctx ends.
func watchSlotCreation(ctx context.Context, done <-chan struct{}, cfg *pgx.ConnConfig, pid uint32, slot string, log *slog.Logger) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	began := time.Now()
	tick := time.NewTicker(blockerReport)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var err error
		if conn == nil {
			conn, err = pgx.ConnectConfig(qctx, cfg)
			if err != nil {
				conn = nil
			}
		}
		var blockers []string
		if err == nil {
			blockers, err = slotBlockers(qctx, conn, pid)
		}
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("creating the replication slot waits for transactions to end; could not read which", "slot", slot,
				"waiting", time.Since(began).Round(time.Second).String(), "error", err)
		case err == nil:
			log.Warn("creating the replication slot waits for every transaction that was running when it began to end; "+
				"end these (COMMIT or ROLLBACK them, COMMIT PREPARED or ROLLBACK PREPARED a prepared one, or SELECT pg_terminate_backend(pid))",
				"slot", slot, "waiting", time.Since(began).Round(time.Second).String(), "blockers", strings.Join(blockers, "; "))
		}
	}
}

// slotBlockers lists the transactions with a transaction id other than the
// creating backend's (those slot creation waits for), oldest first, and
// the prepared transactions.
func slotBlockers(ctx context.Context, conn *pgx.Conn, pid uint32) ([]string, error) {
	rows, err := conn.Query(ctx, `
		SELECT format('pid %s (%s for %s, transaction open %s, database %s, user %s): %s',
			pid, coalesce(state, '?'), date_trunc('second', now() - coalesce(state_change, xact_start)),
			date_trunc('second', now() - xact_start), coalesce(datname, '?'), coalesce(usename, '?'), left(query, 200))
		FROM pg_stat_activity
		WHERE backend_xid IS NOT NULL AND pid <> $1
		UNION ALL
		SELECT format('prepared transaction %L (prepared %s ago, database %s, owner %s)',
			gid, date_trunc('second', now() - prepared), database, owner)
		FROM pg_prepared_xacts`, int32(pid))
	if err != nil {
		return nil, err
	}
	blockers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err == nil && len(blockers) == 0 {
		blockers = []string{"none with a transaction id now; it waits for the ones that were running"}
	}
	return blockers, err
}

// cancelCreation cancels the backend pid, on a connection of its own, and
// waits until it no longer runs the creation, so that nothing of it is left
// behind.
func cancelCreation(ctx context.Context, cfg *pgx.ConnConfig, pid uint32) error {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for {
		var running bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active')`, int32(pid)).Scan(&running)
		if err != nil {
			return err
		}
		if !running {
			return nil
		}
		if _, err := conn.Exec(ctx, `SELECT pg_cancel_backend($1)`, int32(pid)); err != nil {
			return fmt.Errorf("pg_cancel_backend: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
