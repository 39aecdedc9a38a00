package replication

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestNextStatus(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const status, keepalive = 200 * time.Millisecond, 10 * time.Second
	tests := []struct {
		name                string
		since               time.Duration // since the last update
		confirmed, lastSent pglogrepl.LSN
		force               bool
		wantDue             bool
		wantPos             pglogrepl.LSN
	}{
		{"moved, interval passed", 250 * time.Millisecond, 200, 100, false, true, 200},
		{"moved, too soon", 50 * time.Millisecond, 200, 100, false, false, 0},
		{"not moved, before keepalive", 5 * time.Second, 100, 100, false, false, 0},
		{"not moved, keepalive due", 10 * time.Second, 100, 100, false, true, 100},
		{"server asked, too soon", time.Millisecond, 100, 100, true, true, 100},
		{"never backwards", 11 * time.Second, 50, 100, false, true, 100},
		{"never backwards when forced", 0, 0, 100, true, true, 100},
		{"first update at 0/0", keepalive, 0, 0, false, true, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := t0.Add(tc.since)
			u, due := nextStatus(now, tc.confirmed, tc.lastSent, t0, status, keepalive, tc.force)
			if due != tc.wantDue {
				t.Fatalf("due = %v, want %v", due, tc.wantDue)
			}
			if !due {
				return
			}
			// All three positions explicitly, never left for pglogrepl to
			// fill in: the server releases WAL by the flush position.
			if u.WALWritePosition != tc.wantPos || u.WALFlushPosition != tc.wantPos || u.WALApplyPosition != tc.wantPos {
				t.Fatalf("write/flush/apply = %s/%s/%s, want all %s", u.WALWritePosition, u.WALFlushPosition, u.WALApplyPosition, tc.wantPos)
			}
			if !u.ClientTime.Equal(now) || u.ReplyRequested {
				t.Fatalf("client time %v reply %v", u.ClientTime, u.ReplyRequested)
			}
		})
	}
}

func TestBackoffIsCappedAndJittered(t *testing.T) {
	for attempt := 1; attempt < 40; attempt++ {
		d := backoff(attempt)
		ceiling := min(retryMin<<min(attempt, 20), retryMax)
		if d < ceiling/2 || d > ceiling {
			t.Fatalf("attempt %d: %s outside [%s, %s]", attempt, d, ceiling/2, ceiling)
		}
	}
}

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		code string
		want bool
	}{
		{"", true},      // network error
		{"57P01", true}, // admin shutdown: the server restarts
		{"55006", true}, // slot in use: a hot standby waits
		{"42704", false},
		{"28P01", false},
		{"58P01", false},
	} {
		var err error = errString("network")
		if tc.code != "" {
			err = pgErr(tc.code)
		}
		if got := CauseOf(err).Retryable(); got != tc.want {
			t.Errorf("retryable(%q) = %v, want %v", tc.code, got, tc.want)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func pgErr(code string) error { return &pgconn.PgError{Code: code} }

func TestSilence(t *testing.T) {
	const timeout = 4 * time.Second
	heard := time.Unix(1000, 0)
	for _, tc := range []struct {
		name    string
		quiet   time.Duration
		probed  bool
		timeout time.Duration
		want    int
	}{
		{"heard just now", 0, false, timeout, silenceFine},
		{"quiet, under half", 1999 * time.Millisecond, false, timeout, silenceFine},
		{"half: request a reply", 2 * time.Second, false, timeout, silenceProbe},
		{"reply requested, waiting", 3 * time.Second, true, timeout, silenceFine},
		{"whole timeout: dead", 4 * time.Second, true, timeout, silenceDead},
		{"whole timeout without a probe: dead all the same", 5 * time.Second, false, timeout, silenceDead},
		{"off", time.Hour, false, 0, silenceFine},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := silence(heard.Add(tc.quiet), heard, tc.probed, tc.timeout); got != tc.want {
				t.Fatalf("silence after %s (probed %v) = %d, want %d", tc.quiet, tc.probed, got, tc.want)
			}
		})
	}
}
