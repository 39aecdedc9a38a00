package replication

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotPrimary means the server is a standby (pg_is_in_recovery()): no
// host of --postgres-url is a primary at the moment, or the one given is a
// standby. cdc-outbox never streams from a standby, where (PostgreSQL 16+)
// a logical slot can be read, but one that a failover does not keep.
var ErrNotPrimary = errors.New("the server is a standby (in recovery), not the primary")

// RequirePrimary wraps a ValidateConnect function (the one libpq's
// target_session_attrs chose, or none) so that a connection is accepted
// only from a primary. With a multi-host URL (postgres://h1,h2/db) pgconn
// then tries the next host, as libpq does with
// target_session_attrs=primary, which cdc-outbox thereby implies for every
// connection, the replication connection included: a walsender of a
// standby would otherwise accept START_REPLICATION of a logical slot
// (16+), and a slot there is not the one the primary's confirmations move.
func RequirePrimary(next pgconn.ValidateConnectFunc) pgconn.ValidateConnectFunc {
	return func(ctx context.Context, conn *pgconn.PgConn) error {
		if next != nil {
			if err := next(ctx, conn); err != nil {
				return err
			}
		}
		results, err := conn.Exec(ctx, "SELECT pg_is_in_recovery()").ReadAll()
		if err != nil {
			return err
		}
		if len(results) != 1 || len(results[0].Rows) != 1 || len(results[0].Rows[0]) != 1 {
			return errors.New("pg_is_in_recovery() returned no row")
		}
		if string(results[0].Rows[0][0]) != "f" {
			return fmt.Errorf("%w: %s", ErrNotPrimary, conn.Conn().RemoteAddr())
		}
		return nil
	}
}

// ParseConfig parses url as libpq does (PG* variables fill the gaps;
// several hosts are tried in turn) and makes every connection made with it
// insist on a primary (RequirePrimary).
func ParseConfig(url string) (*pgconn.Config, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	primaryOnly(cfg)
	return cfg, nil
}

// primaryOnly makes cfg accept only a primary; the other hosts of a
// multi-host URL (cfg.Fallbacks) share its ValidateConnect.
func primaryOnly(cfg *pgconn.Config) {
	cfg.ValidateConnect = RequirePrimary(cfg.ValidateConnect)
}

// TextFormats pins, in a connection's startup parameters, the session
// settings that shape the text output of the values the mapping parses
// (timestamps), whatever the server's defaults are. pgoutput sends column
// values as the walsender session prints them, and cdc-outbox republish
// reads rows in text over a session set the same way, so that both produce
// the same bytes.
func TextFormats(params map[string]string) {
	params["DateStyle"] = "ISO, MDY"
	params["TimeZone"] = "UTC"
}

// ConnectPrimary opens a normal connection to url's primary.
func ConnectPrimary(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	primaryOnly(&cfg.Config)
	return pgx.ConnectConfig(ctx, cfg)
}
