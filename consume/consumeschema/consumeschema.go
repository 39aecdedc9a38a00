// Package consumeschema hands package consume's handlers the value of a
// record written in the Confluent wire format (cdc-outbox's Avro, Protobuf
// and JSON Schema value formats, or any Confluent-style serializer) decoded
// into JSON, by the schema its header names.
//
// It is a module of its own,
// github.com/cdc-outbox/cdc-outbox/consume/consumeschema, so that package
// consume does not bring the schema libraries (franz-go's registry client,
// Avro, Protobuf, JSON Schema) to services that read plain JSON.
//
//	reg, _ := schema.NewRegistry(schema.RegistryConfig{URL: "http://registry:8080/apis/ccompat/v7"})
//	cfg.Handler = consumeschema.Handler(schema.NewDecoder(reg), func(ctx context.Context, tx pgx.Tx, r *kgo.Record, v consumeschema.Value) error {
//		var p Payment
//		if err := json.Unmarshal(v.JSON, &p); err != nil { ... }
//		...
//	})
//
// Everything else is consume's: the dedupe by (source, id) runs before the
// value is decoded (a duplicate is skipped without a registry request), and
// a value that cannot be decoded is a handler error that goes through the
// retries and then OnFailure (Stop, or DeadLetter with the original value
// and the reason in the error header). A registry that cannot be asked
// about a schema not cached yet is not the record's fault: the error wraps
// consume.ErrUnavailable, so after the last attempt Run stops under either
// policy rather than dead-letter healthy events; a restart once the
// registry is back goes on from that record.
package consumeschema

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/consume"
	"github.com/cdc-outbox/cdc-outbox/schema"
)

// Value is a record's value decoded by its schema.
type Value struct {
	// JSON is the value as JSON, in the shapes schema.Decoder.Decode
	// documents: for Avro and Protobuf the payload the service wrote, up
	// to the schema's own forms (defaults filled in, Protobuf's 64-bit
	// integers as strings); for JSON Schema the bytes themselves. It must
	// not be kept after the handler returns.
	JSON []byte
	// Schema is the schema the value was written by: its ID and Format.
	Schema schema.Schema
}

// ValueHandler is a consume.Handler that is also given the decoded value.
// Its rules are consume.Handler's: write only through tx, do not commit
// it, keep nothing of r after returning.
type ValueHandler func(ctx context.Context, tx pgx.Tx, r *kgo.Record, v Value) error

// Handler returns a consume.Handler that decodes each record's value with
// d, then calls h. A value that is not in the wire format, whose schema
// the registry does not have, or that does not decode by it is an error
// naming why (a *schema.WireError, *schema.NotFoundError,
// *schema.DecodeError, ...); a registry that cannot be asked is that error
// wrapped in consume.ErrUnavailable.
func Handler(d *schema.Decoder, h ValueHandler) consume.Handler {
	return func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		j, s, err := d.Decode(ctx, r.Value)
		if err != nil {
			if schema.Retryable(err) {
				return fmt.Errorf("%w: %w", consume.ErrUnavailable, err)
			}
			return fmt.Errorf("consumeschema: %w", err)
		}
		return h(ctx, tx, r, Value{JSON: j, Schema: s})
	}
}
