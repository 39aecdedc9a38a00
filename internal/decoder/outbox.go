package decoder

// Outbox says which outbox table the inserts of a relation with RoleOutbox
// belong to, as the caller's catalog found it: the relation itself, or the
// table it is a partition (or inheritance child) of. A stream may carry
// several outboxes; the decoder keeps no Outbox, the caller's registry does.
type Outbox struct {
	// Entry is which of the configured outboxes (a table, or a pattern of
	// names) the table is, by position in the configuration.
	Entry int
	// OID is the outbox table's; 0 when the catalog could not say, and the
	// relation is then its own table.
	OID uint32
	// Schema and Name are the table's name when it was found.
	Schema, Name string
	// Identity is "<system identifier>/<database OID>/<table OID>": unique
	// to the table across clusters and databases, the default source.
	Identity string
}

// Table is the outbox table's name, schema.name as the catalog has it.
func (o Outbox) Table() string { return o.Schema + "." + o.Name }
