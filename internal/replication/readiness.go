package replication

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The states of a standby's copy of the slot, as failover readiness judges
// it. Only a copy that is StandbyReady survives a promotion as the stream's
// slot at (about) the position cdc-outbox confirmed.
const (
	// StandbyReady: a synchronized, persistent, valid copy whose
	// confirmed_flush_lsn is within MaxStandbyBehind of the primary's.
	StandbyReady = "ready"
	// StandbyTemporary: the copy is still temporary, its synchronization
	// blocked (the standby logs "could not synchronize replication slot",
	// e.g. the remote slot needs a catalog xmin the standby no longer
	// has): a promotion drops it.
	StandbyTemporary = "temporary"
	// StandbyBehind: the copy is persistent but more than
	// MaxStandbyBehind behind the primary's slot: a failover resumes there,
	// and what lies between is sent again.
	StandbyBehind = "behind"
	// StandbyMissing: the standby has no slot of that name (not
	// synchronized yet, or sync_replication_slots is off there).
	StandbyMissing = "missing"
	// StandbyNotSynced: the standby has a slot of that name that is no
	// synchronized copy (made there by hand): not the stream's position.
	StandbyNotSynced = "not_synced"
	// StandbyInvalidated: the copy was invalidated on the standby (a
	// conflict with recovery, removed WAL): it cannot stream.
	StandbyInvalidated = "invalidated"
	// StandbyUnreachable: the standby did not answer or could not be read.
	StandbyUnreachable = "unreachable"
)

// StandbyStates are the states a standby's copy can be in, for metrics.
var StandbyStates = []string{StandbyReady, StandbyTemporary, StandbyBehind, StandbyMissing, StandbyNotSynced, StandbyInvalidated, StandbyUnreachable}

// Why the stream is not ready for a failover before any standby is asked.
const (
	// NotFailoverSlot: the slot is not a failover slot (PostgreSQL 16 or
	// older, or created without failover): no standby gets a copy.
	NotFailoverSlot = "not_failover_slot"
	// NoStandby: the connection string names no standby to read.
	NoStandby = "no_standby"
)

// MaxStandbyBehind is how far (WAL bytes) a standby's copy of the slot may
// be behind the primary's and still count as ready. The standby copies the
// slot every few seconds at most (its slot sync worker naps up to 30 s
// while nothing moves), and the primary's slot moves only when cdc-outbox
// confirms; the bound leaves room for that, and a failover within it
// sends again at most that much WAL's events.
const MaxStandbyBehind = 64 << 20

// StandbyCopy is what one standby holds of the slot.
type StandbyCopy struct {
	Addr  string // host:port as the connection string names it
	State string // one of StandbyStates
	// ConfirmedFlush is the copy's confirmed_flush_lsn; BehindBytes how far
	// it is behind the primary's (0 when not behind).
	ConfirmedFlush pglogrepl.LSN
	BehindBytes    int64
	// Err is why the standby could not be read (StandbyUnreachable).
	Err error
}

// Readiness is whether a failover to a standby keeps the stream.
type Readiness struct {
	Ready bool
	// Reason is "" when Ready, else NotFailoverSlot, NoStandby, or the
	// state of the first standby that is not ready.
	Reason   string
	Standbys []StandbyCopy
}

// slotCopy is a standby's row of the slot.
type slotCopy struct {
	exists, synced, temporary, invalidated bool
	confirmed                              pglogrepl.LSN
}

// copyState judges one standby's copy against the primary's confirmed
// position.
func copyState(c slotCopy, primary pglogrepl.LSN, maxBehind int64) (state string, behind int64) {
	if c.confirmed < primary {
		behind = int64(primary - c.confirmed)
	}
	switch {
	case !c.exists:
		return StandbyMissing, 0
	case !c.synced:
		return StandbyNotSynced, 0
	case c.invalidated:
		return StandbyInvalidated, behind
	case c.temporary:
		return StandbyTemporary, behind
	case behind > maxBehind:
		return StandbyBehind, behind
	}
	return StandbyReady, behind
}

// judgeReadiness is ready when the slot is a failover slot and every
// standby holds a ready copy; a standby that could not be read is not
// ready, since nothing says it could take over.
func judgeReadiness(failover bool, standbys []StandbyCopy) Readiness {
	r := Readiness{Standbys: standbys}
	switch {
	case !failover:
		r.Reason = NotFailoverSlot
	case len(standbys) == 0:
		r.Reason = NoStandby
	default:
		for _, s := range standbys {
			if s.State != StandbyReady {
				r.Reason = s.State
				return r
			}
		}
		r.Ready = true
	}
	return r
}

// FailoverReadiness reads, on every host of url but the primary, the
// standby's copy of slot, and judges whether a failover to them keeps the
// stream: failover and confirmed are the primary's slot's. The standbys are
// the other hosts of a multi-host url (postgres://db-1,db-2/app), the same
// list cdc-outbox follows a failover through; a url of one host has none,
// and reads NoStandby. It never fails: a standby that cannot be read is
// StandbyUnreachable.
func FailoverReadiness(ctx context.Context, url, slot string, failover bool, confirmed pglogrepl.LSN) Readiness {
	if !failover {
		return judgeReadiness(false, nil)
	}
	hosts, err := hostConfigs(url)
	if err != nil || len(hosts) < 2 {
		return judgeReadiness(true, nil)
	}
	var standbys []StandbyCopy
	for _, h := range hosts {
		c, primary, err := readCopy(ctx, h.cfg, slot)
		switch {
		case err != nil:
			standbys = append(standbys, StandbyCopy{Addr: h.addr, State: StandbyUnreachable, Err: err})
		case primary:
			// The server cdc-outbox streams from (or another primary,
			// which is no standby either).
		default:
			state, behind := copyState(c, confirmed, MaxStandbyBehind)
			standbys = append(standbys, StandbyCopy{Addr: h.addr, State: state, ConfirmedFlush: c.confirmed, BehindBytes: behind})
		}
	}
	return judgeReadiness(true, standbys)
}

// host is one server a connection string names.
type host struct {
	addr string
	cfg  *pgx.ConnConfig // that server alone, whatever its role
}

// hostConfigs splits url into one configuration per server it names, in
// its order. pgx lists each host once per TLS attempt (sslmode=prefer
// tries TLS, then plain); those stay together as the server's fallbacks.
func hostConfigs(url string) ([]host, error) {
	base, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	var hosts []host
	at := map[string]int{}
	add := func(h string, port uint16, tls *tls.Config) {
		addr := net.JoinHostPort(h, strconv.Itoa(int(port)))
		if i, ok := at[addr]; ok {
			hosts[i].cfg.Fallbacks = append(hosts[i].cfg.Fallbacks, &pgconn.FallbackConfig{Host: h, Port: port, TLSConfig: tls})
			return
		}
		cfg := base.Copy()
		cfg.Host, cfg.Port, cfg.TLSConfig = h, port, tls
		cfg.Fallbacks, cfg.ValidateConnect = nil, nil
		at[addr] = len(hosts)
		hosts = append(hosts, host{addr: addr, cfg: cfg})
	}
	add(base.Host, base.Port, base.TLSConfig)
	for _, fb := range base.Fallbacks {
		add(fb.Host, fb.Port, fb.TLSConfig)
	}
	return hosts, nil
}

// readCopy reads slot's row on the server of cfg, and whether that server
// is a primary.
func readCopy(ctx context.Context, cfg *pgx.ConnConfig, slot string) (c slotCopy, primary bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return c, false, err
	}
	defer conn.Close(context.Background())
	var recovery bool
	var exists *bool
	err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), (SELECT true FROM pg_replication_slots WHERE slot_name = $1),
		coalesce((SELECT (to_jsonb(s)->>'synced')::bool FROM pg_replication_slots s WHERE slot_name = $1), false),
		coalesce((SELECT temporary FROM pg_replication_slots WHERE slot_name = $1), false),
		coalesce((SELECT wal_status = 'lost' OR coalesce(to_jsonb(s)->>'invalidation_reason', '') <> ''
			OR coalesce((to_jsonb(s)->>'conflicting')::bool, false) FROM pg_replication_slots s WHERE slot_name = $1), false),
		coalesce((SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1), '0/0')`, slot).
		Scan(&recovery, &exists, &c.synced, &c.temporary, &c.invalidated, &c.confirmed)
	if err != nil {
		return c, false, err
	}
	c.exists = exists != nil
	return c, !recovery, nil
}

// BlockingSlot is a slot synchronized_standby_slots names that holds the
// logical walsender of a failover slot back: it sends nothing past what the
// standby of that slot received, and that standby is not there.
type BlockingSlot struct {
	Name string
	// Why: missing (no such slot: e.g. inherited by a promoted standby
	// from the old primary's configuration), logical (not a physical
	// slot), invalidated, or inactive (no standby streams from it).
	Why string
}

// blockingStandbySlots reads which slots of synchronized_standby_slots hold
// the walsender back; none on servers without the setting (16 and older).
func blockingStandbySlots(ctx context.Context, conn *pgx.Conn) ([]BlockingSlot, error) {
	rows, _ := conn.Query(ctx, `SELECT n, CASE WHEN s.slot_name IS NULL THEN 'missing'
			WHEN s.slot_type <> 'physical' THEN 'logical'
			WHEN s.wal_status = 'lost' OR coalesce(to_jsonb(s)->>'invalidation_reason', '') <> '' THEN 'invalidated'
			WHEN NOT s.active THEN 'inactive' END
		FROM unnest(string_to_array(replace(nullif(current_setting('synchronized_standby_slots', true), ''), ' ', ''), ',')) n
		LEFT JOIN pg_replication_slots s ON s.slot_name = n`)
	all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (BlockingSlot, error) {
		var b BlockingSlot
		var why *string
		err := row.Scan(&b.Name, &why)
		if why != nil {
			b.Why = *why
		}
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("read synchronized_standby_slots: %w", err)
	}
	var blocking []BlockingSlot
	for _, b := range all {
		if b.Why != "" {
			blocking = append(blocking, b)
		}
	}
	return blocking, nil
}

// StandbySlotsFix is the SQL that lets the walsender go on when blocking
// slots of synchronized_standby_slots (set) hold it back: the setting
// without the slots that do not exist, are logical or invalidated (a
// promoted standby inherits the old primary's list, naming its own slot
// or none that exists here); for an inactive slot, starting its standby is
// the other way.
func StandbySlotsFix(set string, blocking []BlockingSlot) string {
	gone := map[string]bool{}
	var inactive []string
	for _, b := range blocking {
		if b.Why == "inactive" {
			inactive = append(inactive, b.Name)
		} else {
			gone[b.Name] = true
		}
	}
	var keep []string
	for _, n := range strings.Split(strings.ReplaceAll(set, " ", ""), ",") {
		if n != "" && !gone[n] {
			keep = append(keep, n)
		}
	}
	fix := fmt.Sprintf("ALTER SYSTEM SET synchronized_standby_slots = '%s'; SELECT pg_reload_conf();", strings.Join(keep, ","))
	if len(gone) > 0 {
		fix += " (or create the physical slot of the standby that is to take over, and name it there)"
	}
	if len(inactive) > 0 {
		fix = fmt.Sprintf("start the standby that streams from %s, or %s", strings.Join(inactive, ", "), fix)
	}
	return fix
}
