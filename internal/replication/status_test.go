package replication

import (
	"log/slog"
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

// position is a checkpoint as the stream sees it: Idle moves it only when
// nothing is in flight, as checkpoint.Tracker's does.
type position struct {
	confirmed pglogrepl.LSN
	busy      bool
}

func (p *position) Confirmed() pglogrepl.LSN { return p.confirmed }
func (p *position) Wait() <-chan struct{}    { return nil }
func (p *position) Idle(walEnd pglogrepl.LSN) bool {
	if p.busy || walEnd <= p.confirmed {
		return false
	}
	p.confirmed = walEnd
	return true
}

// TestTakeoverNeverGoesBackwards: the first status update after the stream
// acquired the slot carries at least the slot's own position, read after
// acquiring it, whatever the checkpoint says: a hot standby's checkpoint
// starts where the slot was when it started, and the slot may have moved
// far on since.
func TestTakeoverNeverGoesBackwards(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name            string
		own, slot, sent pglogrepl.LSN
		busy            bool
		want, wantOwn   pglogrepl.LSN
	}{
		{"standby behind the slot", 0x1000, 0x9000, 0, false, 0x9000, 0x9000},
		{"in flight here: the checkpoint waits, the update does not go back", 0x1000, 0x9000, 0x1000, true, 0x9000, 0x1000},
		{"slot behind (a promoted standby's copy)", 0x9000, 0x1000, 0x9000, false, 0x9000, 0x9000},
		{"same position", 0x5000, 0x5000, 0x5000, false, 0x5000, 0x5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pos := &position{confirmed: tc.own, busy: tc.busy}
			s := New(Config{Slot: "s"}, nil, pos, slog.New(slog.DiscardHandler))
			s.lastSent, s.lastSentAt = tc.sent, t0
			s.tookOver(tc.slot)
			s.lastSentAt = time.Time{} // as session does once streaming starts
			u, due := nextStatus(t0, pos.Confirmed(), s.lastSent, s.lastSentAt, 200*time.Millisecond, 10*time.Second, false)
			if !due || u.WALFlushPosition != tc.want || u.WALWritePosition != tc.want || u.WALApplyPosition != tc.want {
				t.Fatalf("first update due=%v write/flush/apply %s/%s/%s, want %s", due, u.WALWritePosition, u.WALFlushPosition, u.WALApplyPosition, tc.want)
			}
			if pos.confirmed != tc.wantOwn {
				t.Fatalf("checkpoint at %s, want %s", pos.confirmed, tc.wantOwn)
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
