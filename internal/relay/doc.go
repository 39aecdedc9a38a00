// Package relay is one stream: an outbox's WAL read from a replication
// slot and published to Kafka, assembled from a Config of its own, and the
// recovery protocol that keeps its promise when the world changes under it.
//
// It owns every decision of that protocol, and the I/O at its edge:
//
//   - At every taking of the slot (the start, a hot standby's takeover, a
//     reconnect), what the stream's own records in the checkpoint topic
//     say (the Kafka checkpoint, the history epochs, the published record)
//     is read again and judged against the server's WAL history
//     (checkpoint.Decide, checkpoint.LostPast): what may be skipped, what
//     must be verified first, what history was lost (takeover.go).
//   - On every connection, whether the stream may resume where it was
//     (replication.Judge: a failover past the fork, a server restored
//     under it); a lost history the running stream found is recorded
//     before it stops (Relay.Run).
//   - The history epochs: recorded before any event of a new one is
//     published (lineage.go), and handed to the pipeline, which switches
//     the sources.
//   - The two deliveries, at-least-once and exactly-once, as two types of
//     one interface (delivery.go).
//
// The decisions are pure functions of the checkpoint and replication
// packages; the records are read and written through Store, which Kafka
// implements here and a simulation of the protocol implements in memory.
// The command fills a Config from its flags and runs the parts the relay
// adds to its run group; what it gets back is errors to advise on.
package relay
