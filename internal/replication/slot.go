package replication

import (
	"context"
	"errors"
	"fmt"

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
	// empty before).
	WALStatus string
}

// ReadSlot reads the slot's state on a normal connection.
func ReadSlot(ctx context.Context, conn *pgx.Conn, slot string) (SlotInfo, error) {
	info := SlotInfo{Name: slot}
	var pid *int32
	err := conn.QueryRow(ctx, `SELECT coalesce(plugin, ''), coalesce(database, ''), active, active_pid,
			coalesce(confirmed_flush_lsn, '0/0'), coalesce(restart_lsn, '0/0'), pg_current_wal_lsn(),
			coalesce((pg_current_wal_lsn() - restart_lsn)::bigint, 0), coalesce(wal_status, '')
		FROM pg_replication_slots WHERE slot_name = $1`, slot).
		Scan(&info.Plugin, &info.Database, &info.Active, &pid, &info.ConfirmedFlush, &info.RestartLSN,
			&info.CurrentLSN, &info.RetainedBytes, &info.WALStatus)
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
