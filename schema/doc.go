// Package schema turns an outbox event's JSON payload into a record value
// in the Confluent wire format, by a schema of a registry that speaks the
// Confluent-compatible REST API: a zero magic byte, the schema's id as four
// big-endian bytes, for Protobuf the message indexes, then the Avro or
// Protobuf binary encoding of the payload, or, for JSON Schema, the payload
// itself once the schema accepted it.
//
// The pure parts, tested without a registry: which subject an event's
// schema is under (subject.go, Confluent's naming strategies), the JSON
// shapes each format reads and their encoders (avro.go, protobuf.go,
// jsonschema.go, through hamba/avro, protocompile with protojson, and
// santhosh-tekuri/jsonschema), and the wire header (wire.go, franz-go's
// sr.ConfluentHeader). The I/O: Registry (registry.go) fetches schemas
// through franz-go's sr.Client and keeps them (by id forever, as ids are
// immutable; a subject's latest version for a time its caller chooses),
// and tells an Observer of every call it makes. Encoder (encoder.go) joins
// them for one outbox; Decoder (decoder.go) is its consumer's half: a
// record value back into JSON by the schema its header names.
//
// Errors are facts (errors.go): a payload that does not fit its schema is
// a *MismatchError, a registry that cannot answer a *RegistryError
// (Retryable says whether waiting may help), a subject, version or id the
// registry does not have a *NotFoundError; a record value that is not in
// the wire format a *WireError, one whose bytes do not decode by its
// schema a *DecodeError.
package schema
