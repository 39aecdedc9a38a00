// Package replication owns the PostgreSQL logical-replication connection:
// prerequisite checks, slot creation, START_REPLICATION from the slot's
// confirmed position, receiving XLogData and keepalives, and standby status
// updates carrying the checkpoint's confirmed LSN.
//
// It also owns what the catalog says about the outbox (catalog.go): which
// relation the configured outbox table is, which relations are part of it
// (its partitions and inheritance children, the table renamed or moved),
// whether a relation the stream describes provably is another table, and
// whether the publication publishes every relation of the outbox, compared
// by relation, not by name. A stream may carry several outboxes
// (outboxes.go): the tables configured by name or matched by a pattern, at
// start and as they appear, each told by Classify as a decoder.Outbox. The
// decisions are pure functions of the catalog's answers, tested without a
// server.
//
// Its queries are the streamer's catalog queries: Prepare (prepare.go), the
// Monitor that reads the slot and the publication while streaming
// (monitor.go) and Inspect, what `cdc-outbox status` judges (inspect.go),
// share them. CauseOf (errors.go) is the one classifier of PostgreSQL's
// errors, by SQLSTATE. Errors state facts (an *Error names its condition
// with an Err* sentinel, the slot, the publication, the table, the LSN);
// they may quote the SQL that fixes the server, but never the command's
// flags: the command says what to do about them.
//
// It owns following the primary (primary.go, failover.go): every
// connection it opens insists on a primary, whatever hosts the connection
// string lists, and a stream that reconnects to a promoted standby resumes
// only when it is the same cluster on a newer timeline whose fork lies at
// or after the confirmed position; a slot missing there is never created
// again by itself. On PostgreSQL 17+ it makes the slot a failover slot.
//
// It must never start streaming from the server's current WAL position,
// never send a position the checkpoint has not confirmed, never send a lower
// position than before, and never let Kafka stall its status updates.
package replication
