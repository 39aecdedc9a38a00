// Package sink publishes records to Kafka with franz-go and reports each
// broker acknowledgement to the checkpoint.
//
// It owns the producer: idempotent, acks=all, asynchronous Produce with
// promises, retries while the broker is away. It must never drop a record,
// never report an ack the broker did not give, and never block the
// replication connection's status updates.
//
// Health (health.go) asks the brokers for metadata every few seconds:
// whether Kafka is reachable, for readiness and metrics. FaultOf
// (errors.go) tells a refused SASL login or a failed TLS handshake, which
// no retry cures, from a broker that is merely away.
package sink
