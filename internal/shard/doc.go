// Package shard splits one outbox over K replication slots: which shard an
// aggregate belongs to (Hash, PostgreSQL's hashtext in Go), the row filter
// that keeps a shard's publication to its aggregates (Filter), and the
// names of a shard's publication and slot (Names, Parse). It is pure: no
// connection, no clock.
//
// Every slot decodes the whole WAL and the row filter divides only what
// the walsender sends; logical decoding messages reach every slot whatever
// the filters, so each shard keeps the messages whose aggregate id hashes
// to it (Of), with the same function as the filter.
package shard
