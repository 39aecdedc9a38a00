package replication

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
	sqlfiles "github.com/cdc-outbox/cdc-outbox/sql"
)

// A pattern's tables join the publication only through the membership
// event trigger (sql/outbox-membership.sql): a publication publishes a
// table from the WAL point of the change that added it, so a new tenant's
// rows are streamed only if its table joins in the transaction that creates
// it. Without the trigger every row of a table created after start is lost
// to the stream until someone adds it by hand.

// membershipVersion is the comment the script gives its event trigger: a
// trigger that carries another (an older script) is installed again.
var membershipVersion = regexp.MustCompile(`COMMENT ON EVENT TRIGGER cdc_outbox_membership IS '([^']*)'`).FindStringSubmatch(sqlfiles.Membership)[1]

// Watch is one outbox pattern as the membership trigger registers it
// (cdc_outbox.watch): each part as the catalog stores names, * any run of
// characters. Filter is the row filter a table that comes to match joins
// the publication with (a shard's, shard.Shard.Filter); "" none.
type Watch struct{ Schema, Table, Filter string }

// watches are the registrations of the patterns with wildcards. A pattern
// one of whose literal parts holds a "*" (a quoted name) cannot be told to
// the trigger, whose every * is a wildcard: it is returned in odd.
//
// filter, when not nil, is the row filter of the pattern of entry i.
func watches(ps []pgname.Pattern, filter func(i int) string) (ws []Watch, odd []pgname.Pattern) {
	for i, p := range ps {
		switch {
		case !p.IsGlob():
		case !p.Schema.Glob && strings.Contains(p.Schema.Text, "*"), !p.Relation.Glob && strings.Contains(p.Relation.Text, "*"):
			odd = append(odd, p)
		default:
			w := Watch{Schema: p.Schema.Text, Table: p.Relation.Text}
			if filter != nil {
				w.Filter = filter(i)
			}
			ws = append(ws, w)
		}
	}
	return ws, odd
}

// Membership is what the database says of the membership trigger for a
// publication and its patterns.
type Membership struct {
	// AllTables: the publication is FOR ALL TABLES, which publishes every
	// table from its creation on; no trigger is needed.
	AllTables bool
	// Installed: the trigger of this version of the script is installed
	// and enabled.
	Installed bool
	// Unregistered are the patterns the trigger does not watch for the
	// publication (all of them when it cannot be told).
	Unregistered []Watch
	// Superuser: the role may install it (event triggers need one).
	Superuser bool
}

// Complete reports whether every table that comes to match a pattern joins
// the publication by itself.
func (m Membership) Complete() bool { return m.AllTables || (m.Installed && len(m.Unregistered) == 0) }

func readMembership(ctx context.Context, conn *pgx.Conn, publication string, ws []Watch) (Membership, error) {
	var m Membership
	var readable bool
	err := conn.QueryRow(ctx, `SELECT coalesce((SELECT puballtables FROM pg_publication WHERE pubname = $1), false),
		EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cdc_outbox_membership' AND evtenabled <> 'D'
			AND obj_description(oid, 'pg_event_trigger') = $2),
		(SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
		CASE WHEN to_regclass('cdc_outbox.membership') IS NULL THEN false ELSE has_table_privilege('cdc_outbox.membership', 'SELECT') END`,
		publication, membershipVersion).Scan(&m.AllTables, &m.Installed, &m.Superuser, &readable)
	if err != nil {
		return m, fmt.Errorf("read whether the membership trigger (sql/outbox-membership.sql) is installed: %w", err)
	}
	if !readable {
		m.Unregistered = ws
		return m, nil
	}
	schemas, tables, filters := make([]string, len(ws)), make([]string, len(ws)), make([]string, len(ws))
	for i, w := range ws {
		schemas[i], tables[i], filters[i] = w.Schema, w.Table, w.Filter
	}
	// A pattern with a row filter (a shard's) is registered only with that
	// filter; one without, whatever its filter (status does not know it).
	// The row filter through JSON: a table of an older script has none.
	rows, _ := conn.Query(ctx, `SELECT w.s, w.t, w.f FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS w(s, t, f, i)
		WHERE NOT EXISTS (SELECT 1 FROM cdc_outbox.membership m WHERE m.publication = $1 AND m.schema_pattern = w.s AND m.table_pattern = w.t
			AND (w.f = '' OR coalesce(to_jsonb(m) ->> 'row_filter', '') = w.f))
		ORDER BY w.i`, publication, schemas, tables, filters)
	m.Unregistered, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Watch, error) {
		var w Watch
		err := row.Scan(&w.Schema, &w.Table, &w.Filter)
		return w, err
	})
	if err != nil {
		return m, fmt.Errorf("read the patterns the membership trigger watches: %w", err)
	}
	return m, nil
}

// installMembership runs the script and registers the patterns, in one
// transaction under an advisory lock: two instances starting at once (a
// hot standby beside the active one) would otherwise race to create the
// same objects.
func installMembership(ctx context.Context, conn *pgx.Conn, publication string, ws []Watch) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('cdc_outbox.membership'))`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlfiles.Membership); err != nil {
			return fmt.Errorf("run sql/outbox-membership.sql: %w", err)
		}
		for _, w := range ws {
			call, args := `SELECT cdc_outbox.watch($1, $2, $3)`, []any{publication, w.Schema, w.Table}
			if w.Filter != "" {
				call, args = `SELECT cdc_outbox.watch($1, $2, $3, $4)`, append(args, w.Filter)
			}
			if _, err := tx.Exec(ctx, call, args...); err != nil {
				return fmt.Errorf("register pattern %s.%s: %w", w.Schema, w.Table, err)
			}
		}
		return nil
	})
}

// MembershipCommand is the one command a superuser runs to install the
// trigger and register the patterns in database.
func MembershipCommand(database, publication string, ws []Watch) string {
	var calls []string
	for _, w := range ws {
		filter := ""
		if w.Filter != "" {
			filter = ", " + quoteLiteral(w.Filter)
		}
		calls = append(calls, fmt.Sprintf("SELECT cdc_outbox.watch(%s, %s, %s%s)", quoteLiteral(publication), quoteLiteral(w.Schema), quoteLiteral(w.Table), filter))
	}
	cmd := fmt.Sprintf("psql -d %s -v ON_ERROR_STOP=1 -f sql/outbox-membership.sql", shellWord(database))
	if len(calls) > 0 {
		// Inside double quotes the shell still reads \ " $ and `: a
		// quoted name (a row filter's column) keeps its quotes.
		cmd += ` -c "` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`, "`", "\\`").Replace(strings.Join(calls, "; ")) + `"`
	}
	return cmd
}

// prepareMembership makes sure that a table which comes to match one of
// the patterns joins the publication in the transaction that makes it
// match: when the role may (a superuser, and create is set, as for the
// publication), by installing the trigger and registering the patterns;
// otherwise it says, loudly, the one command that does it.
func prepareMembership(ctx context.Context, conn *pgx.Conn, s Setup, log *slog.Logger) error {
	var filter func(int) string
	if s.Shard.Split() {
		filter = func(i int) string { return s.Shard.Filter(pgname.Quote(s.AggregateIDs[i])) }
	}
	ws, odd := watches(s.Outboxes, filter)
	for _, p := range odd {
		log.Warn("an outbox pattern has a quoted part holding *, which the membership trigger (sql/outbox-membership.sql) reads as a wildcard: "+
			"it is not registered, so tables that come to match it join the publication only when added by hand",
			"pattern", p.String(), "publication", s.Publication)
	}
	if len(ws) == 0 {
		return nil
	}
	m, err := readMembership(ctx, conn, s.Publication, ws)
	if err != nil || m.Complete() {
		return err
	}
	why := "the role is no superuser (event triggers need one)"
	switch {
	case !s.CreatePublication:
		why = "creating what is missing is turned off"
	case m.Superuser:
		err := installMembership(ctx, conn, s.Publication, ws)
		if err == nil {
			log.Info("installed the membership trigger (sql/outbox-membership.sql): a table created, renamed or moved so that it matches an outbox pattern "+
				"joins the publication in the same transaction", "publication", s.Publication, "patterns", describeWatches(ws))
			return nil
		}
		// The tables that match now stream; say what the others need.
		why = "installing it failed: " + err.Error()
	}
	var database string
	if err := conn.QueryRow(ctx, `SELECT current_database()::text`).Scan(&database); err != nil {
		return err
	}
	log.Error("tables that come to match an outbox pattern after now will not join the publication, so none of their rows will be streamed "+
		"until each is added by hand: the membership trigger is not installed, or not for these patterns, and "+why+". "+
		"Run once, as a superuser: "+MembershipCommand(database, s.Publication, m.Unregistered),
		"publication", s.Publication, "patterns", describeWatches(m.Unregistered), "installed", m.Installed)
	return nil
}

// shellWord is s as one word of a POSIX shell command.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func describeWatches(ws []Watch) string {
	var names []string
	for _, w := range ws {
		names = append(names, w.Schema+"."+w.Table)
	}
	return strings.Join(names, ", ")
}
