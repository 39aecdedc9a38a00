// Package replication owns the PostgreSQL logical-replication connection:
// prerequisite checks, slot creation, START_REPLICATION from the slot's
// confirmed position, receiving XLogData and keepalives, and standby status
// updates carrying the checkpoint's confirmed LSN.
//
// It must never start streaming from the server's current WAL position,
// never send a position the checkpoint has not confirmed, never send a lower
// position than before, and never let Kafka stall its status updates.
package replication
