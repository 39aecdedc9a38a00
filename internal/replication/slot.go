package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// ErrSlotMissing means the replication slot does not exist.
var ErrSlotMissing = errors.New("replication slot does not exist")

// SlotInfo is what pg_replication_slots says about a slot, plus how much
// WAL it makes the server keep.
type SlotInfo struct {
	Name      string
	Plugin    string
	Database  string
	Active    bool
	ActivePID int32 // 0 when inactive
	// ConfirmedFlush is what the streamer confirmed last; RestartLSN is the
	// oldest WAL the slot still needs.
	ConfirmedFlush pglogrepl.LSN
	RestartLSN     pglogrepl.LSN
	CurrentLSN     pglogrepl.LSN // pg_current_wal_lsn() at the time of reading
	// RetainedBytes is CurrentLSN - RestartLSN: WAL kept for this slot.
	RetainedBytes int64
	// WALStatus is reserved, extended, unreserved or lost (PostgreSQL 13+;
	// empty before). Since PostgreSQL 16 every invalidated slot is lost,
	// whatever the reason.
	WALStatus string

	// The columns newer servers add; zero where the server lacks them.
	//
	// InvalidationReason (PostgreSQL 17+) says why PostgreSQL invalidated
	// the slot: wal_removed, rows_removed, wal_level_insufficient, or
	// idle_timeout (18+); "" while the slot is valid.
	InvalidationReason string
	// Conflicting (PostgreSQL 16+): a logical slot on a standby that was
	// invalidated by a conflict with recovery (false on a primary).
	Conflicting bool
	// InactiveSince (PostgreSQL 17+) is when the slot was last released;
	// zero while it is active. InactiveFor is how long ago that was, by the
	// server's clock.
	InactiveSince time.Time
	InactiveFor   time.Duration

	// Failover (PostgreSQL 17+): the slot is synchronized to standbys that
	// have sync_replication_slots = on. Synced (17+): this is such a copy,
	// read on a standby (or on one promoted since).
	Failover, Synced bool
	// InRecovery: the server read is a standby.
	InRecovery bool
	// StandbySlots is the server's synchronized_standby_slots (17+): the
	// physical slots of the standbys whose receipt of WAL the logical
	// walsenders wait for; StandbysStreaming, whether every slot it names
	// exists and is active, a standby streaming from it.
	StandbySlots      string
	StandbysStreaming bool

	// HolderAddr is the client address of the process streaming from the
	// slot (pg_stat_replication.client_addr; in Kubernetes, the holding
	// pod's IP), HolderSince when its connection began: "" and zero while
	// inactive, or for a Unix-socket connection, or when the role may not
	// see that session.
	HolderAddr  string
	HolderSince time.Time
}

// Invalidated reports whether PostgreSQL invalidated the slot: it can never
// stream again.
func (i SlotInfo) Invalidated() bool {
	return i.WALStatus == "lost" || i.InvalidationReason != "" || i.Conflicting
}

// Reason is why the slot was invalidated, as precisely as the server says:
// its invalidation_reason (17+), "conflict" for a conflicting slot (16),
// else "" (the WAL was removed: before 16, the only reason).
func (i SlotInfo) Reason() string {
	switch {
	case i.InvalidationReason != "":
		return i.InvalidationReason
	case i.Conflicting:
		return reasonConflict
	}
	return ""
}

// slotColumns reads the columns of a pg_replication_slots row s that only
// newer servers have, by name from the row as JSON, so that one query
// serves every version: a column the server lacks reads as NULL.
// PostgreSQL 16 sets conflicting for a logical slot invalidated for any
// reason, lost WAL included (17 only for conflicts with recovery), so it
// counts only on a standby, the only place such a conflict can happen.
const slotColumns = `coalesce(to_jsonb(s)->>'invalidation_reason', ''),
	coalesce((to_jsonb(s)->>'conflicting')::bool, false) AND pg_is_in_recovery(),
	(to_jsonb(s)->>'inactive_since')::timestamptz`

// ReadSlot reads the slot's state on a normal connection.
func ReadSlot(ctx context.Context, conn *pgx.Conn, slot string) (SlotInfo, error) {
	info := SlotInfo{Name: slot}
	var pid *int32
	var inactiveSince, holderSince *time.Time
	var inactiveFor *float64
	// On a standby the WAL position is what it replayed: pg_current_wal_lsn()
	// fails during recovery.
	err := conn.QueryRow(ctx, `WITH w(lsn) AS (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END),
		sss(names) AS (SELECT string_to_array(replace(nullif(current_setting('synchronized_standby_slots', true), ''), ' ', ''), ','))
		SELECT coalesce(plugin, ''), coalesce(database, ''), active, active_pid,
			coalesce(confirmed_flush_lsn, '0/0'), coalesce(restart_lsn, '0/0'), coalesce(w.lsn, '0/0'),
			coalesce((w.lsn - restart_lsn)::bigint, 0), coalesce(wal_status, ''), `+slotColumns+`,
			extract(epoch FROM now() - (to_jsonb(s)->>'inactive_since')::timestamptz)::float8,
			coalesce((to_jsonb(s)->>'failover')::bool, false), coalesce((to_jsonb(s)->>'synced')::bool, false), pg_is_in_recovery(),
			coalesce(current_setting('synchronized_standby_slots', true), ''),
			coalesce((SELECT count(*) = cardinality(sss.names) AND bool_and(p.active) FROM pg_replication_slots p
				WHERE p.slot_name = ANY(sss.names)), false),
			coalesce((SELECT host(r.client_addr) FROM pg_stat_replication r WHERE r.pid = s.active_pid), ''),
			(SELECT r.backend_start FROM pg_stat_replication r WHERE r.pid = s.active_pid)
		FROM pg_replication_slots s, w, sss WHERE slot_name = $1`, slot).
		Scan(&info.Plugin, &info.Database, &info.Active, &pid, &info.ConfirmedFlush, &info.RestartLSN,
			&info.CurrentLSN, &info.RetainedBytes, &info.WALStatus, &info.InvalidationReason, &info.Conflicting, &inactiveSince, &inactiveFor,
			&info.Failover, &info.Synced, &info.InRecovery, &info.StandbySlots, &info.StandbysStreaming, &info.HolderAddr, &holderSince)
	if holderSince != nil {
		info.HolderSince = *holderSince
	}
	if inactiveSince != nil && inactiveFor != nil {
		info.InactiveSince, info.InactiveFor = *inactiveSince, time.Duration(*inactiveFor*float64(time.Second))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return info, fmt.Errorf("%w: %s", ErrSlotMissing, slot)
	}
	if err != nil {
		return info, fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	if pid != nil {
		info.ActivePID = *pid
	}
	return info, nil
}

// heldSlotPosition reads, on a normal connection, the confirmed_flush_lsn
// of the slot that the walsender pid holds. Held, the slot moves only by
// that walsender's status updates, so the position read is final until the
// stream sends one. An error if the slot is not held by pid (another
// server answered the normal connection, or the walsender is gone).
func heldSlotPosition(ctx context.Context, url, slot string, pid uint32) (pglogrepl.LSN, error) {
	conn, err := connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var active *int32
	var confirmed pglogrepl.LSN
	err = conn.QueryRow(ctx, `SELECT active_pid, coalesce(confirmed_flush_lsn, '0/0') FROM pg_replication_slots WHERE slot_name = $1`, slot).
		Scan(&active, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w: %s", ErrSlotMissing, slot)
	}
	if err != nil {
		return 0, fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	if active == nil || uint32(*active) != pid {
		holder := "no process"
		if active != nil {
			holder = fmt.Sprintf("process %d", *active)
		}
		return 0, fmt.Errorf("replication slot %s is held by %s, not by this stream's walsender (process %d)", slot, holder, pid)
	}
	return confirmed, nil
}
