package main

import (
	"context"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cdc-outbox/cdc-outbox/internal/replication"
)

// validSource reports whether s may be given as --source: empty (the
// default) or 1 to 255 bytes of printable UTF-8, which every consumer can
// store and log as it is.
func validSource(s string) bool {
	if len(s) > 255 || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// resolveSource returns --source, or its default: the outbox table's
// identity as PostgreSQL keeps it, "<system identifier>/<database
// OID>/<table OID>".
//
// Event ids are unique only within one outbox table (its own sequence), so
// the source must differ between tables, including tables of the same name
// in databases of the same name on different clusters, the common case of
// one database per service: the system identifier tells clusters apart, the
// OIDs databases and tables. It must not change while the ids go on, or a
// redelivered event would pass for a new one: the identifier and OIDs
// survive restarts, failover to a physical standby, and renaming the table,
// its schema or its database. A table dropped and created again gets a new
// OID, and rightly a new source, since its ids start again. A new cluster
// (pg_upgrade, a restore, a logical replica taking over) gets a new system
// identifier, so set --source to a name of your own to keep the source
// across such a move.
func resolveSource(ctx context.Context, c *runConfig) (string, error) {
	if c.Source != "" {
		return c.Source, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := replication.ConnectPrimary(ctx, c.PostgresURL)
	if err != nil {
		return "", fmt.Errorf("connect to PostgreSQL to derive the default --source: %w", replication.ExplainConnect(err))
	}
	defer conn.Close(context.Background())
	table := outboxTable(c.Table)
	var source *string
	err = conn.QueryRow(ctx, `SELECT (SELECT system_identifier FROM pg_control_system())::text
		|| '/' || (SELECT oid FROM pg_database WHERE datname = current_database())::text
		|| '/' || to_regclass($1)::oid::text`, table.Quoted()).Scan(&source)
	switch {
	case err != nil:
		return "", fmt.Errorf("derive the default --source from table %s: %w (or set --source)", c.Table, err)
	case source == nil:
		return "", fmt.Errorf("derive the default --source: table %s does not exist", table)
	}
	return *source, nil
}
