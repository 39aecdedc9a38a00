// Package sink publishes records to Kafka with franz-go and reports each
// broker acknowledgement to the checkpoint.
//
// It owns the producer: idempotent, acks=all, asynchronous Produce with
// promises, retries while the broker is away. It must never drop a record,
// never report an ack the broker did not give, and never block the
// replication connection's status updates.
//
// In exactly-once delivery Transactional (txn.go) is the producer instead:
// it writes whole PostgreSQL transactions and a checkpoint record of their
// end LSN in one Kafka transaction, and reports a record acknowledged only
// once that transaction committed. The checkpoint topic (position.go) is
// created, and read back at start, here too.
//
// Health (health.go) asks the brokers for metadata every few seconds:
// whether Kafka is reachable, for readiness and metrics. FaultOf
// (errors.go) tells a refused SASL login or a failed TLS handshake, which
// no retry cures, from a broker that is merely away.
package sink
