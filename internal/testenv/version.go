package testenv

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// ServerMajor returns the major version of the PostgreSQL server at url
// (14 for 14.23), for tests of what differs between versions. `make test`
// runs the core tests on every supported major (scripts/test-versions.sh).
func ServerMajor(t testing.TB, url string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), slotWait)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	var num int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&num); err != nil {
		t.Fatalf("read server_version_num: %v", err)
	}
	return num / 10000
}
