// Package checkpoint decides which WAL position may be confirmed to
// PostgreSQL.
//
// It tracks transactions from Begin to Commit and the broker acknowledgements
// of their records, which may arrive in any order, and releases the newest
// prefix of transactions that are complete: committed, and every record acked.
// The confirmed LSN is the commit end LSN of the last transaction in that
// prefix. It never moves backwards, and a keepalive's WAL end may become the
// confirmed position only when nothing is open or in flight.
//
// It is the only state that both the replication side and the sink side touch,
// so it is lock-protected and does no I/O; it must never confirm a position
// past a record that the broker has not acknowledged.
//
// Use, from the goroutine that reads the replication stream, in stream order:
//
//	tr := checkpoint.New(slotConfirmedLSN)
//	tx := tr.Begin(begin.CommitTime)          // BeginMessage
//	tr.Add(tx, 1)                             // before producing the record
//	produce(rec, func(err error) {            // broker callback, any goroutine
//		if err == nil {                   // a failed record is never acked
//			tr.Ack(tx)
//		}
//	})
//	tr.Commit(tx, commit.TransactionEndLSN)   // CommitMessage
//	tr.Idle(keepalive.ServerWALEnd)           // PrimaryKeepaliveMessage
//	tr.Discard(tx)                            // connection lost with tx open
//
// and a status loop sends tr.Confirmed() as the flushed and applied position,
// waking on tr.Wait() (call Wait before Confirmed so no advance is missed).
//
// It also decides, purely, what an exactly-once Kafka checkpoint lets the
// stream skip on a server's WAL history (Mark, Decide): LSNs are places in
// one history only, and a promoted standby or a restored base backup
// reuses them for other transactions.
package checkpoint
