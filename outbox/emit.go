package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

// The outbox without a table: Emit writes an event as a transactional
// logical decoding message (pg_logical_emit_message), which PostgreSQL
// puts into the WAL alone, and the streamer publishes as the record a row
// of the same values would become. No heap tuple, no index entry, nothing
// to delete or vacuum; but no row either, so nothing to query, audit or
// republish from (the streamer's docs/messages.md).

// emitSQL writes the envelope; the database adds created_at, the
// transaction's start as the outbox table's default does, so rows and
// messages of one transaction carry the same timestamp. to_json writes a
// timestamptz in ISO 8601 with its offset whatever DateStyle says.
const emitSQL = `SELECT pg_logical_emit_message(true, $1::text, $2::text || ',"created_at":' || to_json(now())::text || '}')`

// Emit writes e inside tx as a message of the default prefix
// (contract.DefaultMessagePrefix) and returns its event id. See
// Writer.Emit.
func Emit(ctx context.Context, tx Tx, e Event) (string, error) {
	return defaultWriter.Emit(ctx, tx, e)
}

// EmitSQL is Emit for database/sql. See Writer.EmitSQL.
func EmitSQL(ctx context.Context, tx SQLTx, e Event) (string, error) {
	return defaultWriter.EmitSQL(ctx, tx, e)
}

// Emit writes e inside tx, the transaction of the business write, as a
// transactional logical decoding message of the Writer's MessagePrefix,
// and returns the event id it gave the event: a UUID (version 7, so ids
// grow with time), the "id" header consumers dedupe by. As with Write, the
// event is published once tx commits and never if it rolls back, in its
// place among tx's outbox rows and messages; it is checked as Write checks
// it, and an invalid event wraps ErrInvalidEvent and sends nothing.
//
// The Writer's table is not used: there is no row.
func (w *Writer) Emit(ctx context.Context, tx Tx, e Event) (string, error) {
	if tx == nil {
		return "", ErrNoTx
	}
	return w.emit(e, func(content string) error { _, err := tx.Exec(ctx, emitSQL, w.prefix, content); return err })
}

// EmitSQL is Emit for database/sql: the same message, the same checks.
func (w *Writer) EmitSQL(ctx context.Context, tx SQLTx, e Event) (string, error) {
	if t, ok := tx.(*sql.Tx); tx == nil || ok && t == nil {
		return "", ErrNoTx
	}
	return w.emit(e, func(content string) error { _, err := tx.ExecContext(ctx, emitSQL, w.prefix, content); return err })
}

func (w *Writer) emit(e Event, exec func(content string) error) (string, error) {
	args, err := w.eventArgs(e)
	if err != nil {
		return "", err
	}
	id, err := newID()
	if err != nil {
		return "", fmt.Errorf("outbox: event id: %w", err)
	}
	env := contract.Envelope{ID: id, AggregateType: e.AggregateType, AggregateID: e.AggregateID, EventType: e.EventType, Payload: e.Payload}
	if h, ok := args[4].(string); ok {
		env.Headers = []byte(h)
	}
	b := contract.AppendEnvelope(nil, env)
	// Without its closing brace: emitSQL appends created_at and closes it.
	if err := exec(string(b[:len(b)-1])); err != nil {
		return "", fmt.Errorf("outbox: emit event %s (pg_logical_emit_message, prefix %q): %w", id, w.prefix, err)
	}
	return id, nil
}

// newID is a version 7 UUID (RFC 9562): 48 bits of Unix milliseconds, then
// random bits.
func newID() (string, error) {
	var u [16]byte
	if _, err := rand.Read(u[6:]); err != nil {
		return "", err
	}
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(time.Now().UnixMilli()))
	copy(u[:6], ms[2:])
	u[6] = u[6]&0x0f | 0x70 // version 7
	u[8] = u[8]&0x3f | 0x80 // variant 10
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:]), nil
}
