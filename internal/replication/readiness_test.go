package replication

import (
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestCopyState: a standby's copy is ready only when it exists, is a
// synchronized copy, valid, persistent, and within the bound of the
// primary's position.
func TestCopyState(t *testing.T) {
	const primary, bound = 0x10000, 0x1000
	ok := slotCopy{exists: true, synced: true, confirmed: primary}
	for _, c := range []struct {
		name   string
		copy   func(c slotCopy) slotCopy
		state  string
		behind int64
	}{
		{"caught up", func(c slotCopy) slotCopy { return c }, StandbyReady, 0},
		{"within the bound", func(c slotCopy) slotCopy { c.confirmed = primary - bound; return c }, StandbyReady, bound},
		{"past the bound", func(c slotCopy) slotCopy { c.confirmed = primary - bound - 1; return c }, StandbyBehind, bound + 1},
		{"ahead (read after the primary)", func(c slotCopy) slotCopy { c.confirmed = primary + 5; return c }, StandbyReady, 0},
		{"temporary", func(c slotCopy) slotCopy { c.temporary = true; return c }, StandbyTemporary, 0},
		{"temporary and behind", func(c slotCopy) slotCopy { c.temporary, c.confirmed = true, 0; return c }, StandbyTemporary, primary},
		{"invalidated", func(c slotCopy) slotCopy { c.invalidated = true; return c }, StandbyInvalidated, 0},
		{"made by hand", func(c slotCopy) slotCopy { c.synced = false; return c }, StandbyNotSynced, 0},
		{"missing", func(slotCopy) slotCopy { return slotCopy{} }, StandbyMissing, 0},
	} {
		state, behind := copyState(c.copy(ok), primary, bound)
		if state != c.state || behind != c.behind {
			t.Errorf("%s: %s, %d bytes behind; want %s, %d", c.name, state, behind, c.state, c.behind)
		}
	}
}

// TestJudgeReadiness: ready needs a failover slot, a standby, and every
// standby ready; the reason is the first that is not.
func TestJudgeReadiness(t *testing.T) {
	ready := StandbyCopy{Addr: "db-2:5432", State: StandbyReady}
	temp := StandbyCopy{Addr: "db-3:5432", State: StandbyTemporary}
	gone := StandbyCopy{Addr: "db-4:5432", State: StandbyUnreachable}
	for _, c := range []struct {
		name     string
		failover bool
		standbys []StandbyCopy
		ready    bool
		reason   string
	}{
		{"not a failover slot", false, []StandbyCopy{ready}, false, NotFailoverSlot},
		{"no standby", true, nil, false, NoStandby},
		{"one ready", true, []StandbyCopy{ready}, true, ""},
		{"one temporary", true, []StandbyCopy{ready, temp}, false, StandbyTemporary},
		{"one unreachable", true, []StandbyCopy{gone, ready}, false, StandbyUnreachable},
	} {
		r := judgeReadiness(c.failover, c.standbys)
		if r.Ready != c.ready || r.Reason != c.reason {
			t.Errorf("%s: ready %v, reason %q; want %v, %q", c.name, r.Ready, r.Reason, c.ready, c.reason)
		}
	}
}

// TestStandbySlotsFix: the fix keeps the slots that exist, and for an
// inactive one says to start its standby.
func TestStandbySlotsFix(t *testing.T) {
	for _, c := range []struct {
		set      string
		blocking []BlockingSlot
		want     string
	}{
		{"sb1", []BlockingSlot{{"sb1", "missing"}},
			"ALTER SYSTEM SET synchronized_standby_slots = ''; SELECT pg_reload_conf(); (or create the physical slot of the standby that is to take over, and name it there)"},
		{"sb1, sb2", []BlockingSlot{{"sb1", "missing"}},
			"ALTER SYSTEM SET synchronized_standby_slots = 'sb2'; SELECT pg_reload_conf(); (or create the physical slot of the standby that is to take over, and name it there)"},
		{"sb1,sb2", []BlockingSlot{{"sb2", "inactive"}},
			"start the standby that streams from sb2, or ALTER SYSTEM SET synchronized_standby_slots = 'sb1,sb2'; SELECT pg_reload_conf();"},
	} {
		if got := StandbySlotsFix(c.set, c.blocking); got != c.want {
			t.Errorf("StandbySlotsFix(%q, %v):\n got %s\nwant %s", c.set, c.blocking, got, c.want)
		}
	}
}

// TestHostConfigs: one configuration per server of a multi-host URL, in
// its order, whatever the TLS attempts pgx adds for each.
func TestHostConfigs(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"postgres://u@db-1:5432,db-2:5433/app?sslmode=disable", "[db-1:5432 db-2:5433]"},
		{"postgres://u@db-1,db-2/app?sslmode=prefer", "[db-1:5432 db-2:5432]"},
		{"postgres://u@db-1/app", "[db-1:5432]"},
	} {
		hosts, err := hostConfigs(c.url)
		if err != nil {
			t.Fatal(err)
		}
		var addrs []string
		for _, h := range hosts {
			addrs = append(addrs, h.addr)
			if got := net.JoinHostPort(h.cfg.Host, fmt.Sprint(h.cfg.Port)); got != h.addr {
				t.Errorf("%s: config of %s connects to %s", c.url, h.addr, got)
			}
			for _, fb := range h.cfg.Fallbacks {
				if fb.Host != h.cfg.Host || fb.Port != h.cfg.Port {
					t.Errorf("%s: config of %s falls back to %s:%d", c.url, h.addr, fb.Host, fb.Port)
				}
			}
		}
		if got := fmt.Sprint(addrs); got != c.want {
			t.Errorf("%s: hosts %s, want %s", c.url, got, c.want)
		}
	}
}

// TestStandbySlotsWait: the walsender's repeated notice about a standby
// slot of synchronized_standby_slots is told by SQLSTATE and the
// parameter's name.
func TestStandbySlotsWait(t *testing.T) {
	for _, c := range []struct {
		n    pgconn.PgError
		want bool
	}{
		{pgconn.PgError{Code: pgerrcode.InvalidParameterValue, Message: `replication slot "sb1" specified in parameter "synchronized_standby_slots" does not exist`}, true},
		{pgconn.PgError{Code: pgerrcode.ObjectNotInPrerequisiteState, Message: `replication slot "sb1" specified in parameter "synchronized_standby_slots" does not have active_pid`}, true},
		{pgconn.PgError{Code: pgerrcode.ObjectNotInPrerequisiteState, Message: `skipped loading publication "cdc_outbox"`}, false},
		{pgconn.PgError{Code: pgerrcode.DeprecatedFeature, Message: "synchronized_standby_slots"}, false},
	} {
		if got := standbySlotsWait(&c.n); got != c.want {
			t.Errorf("%s %q: %v, want %v", c.n.Code, c.n.Message, got, c.want)
		}
	}
}
