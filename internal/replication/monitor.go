package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// SlotObserver is told the slot's state at every read; metrics implement
// it. A missing slot reads as inactive, holding nothing, with no
// wal_status.
type SlotObserver interface {
	Slot(active bool, retainedBytes int64, walStatus string)
	// SlotFailover: whether the slot is a failover slot (17+), whether a
	// failover keeps the stream (Readiness.Ready), and each standby's
	// state (address → one of StandbyStates).
	SlotFailover(failover, ready bool, standbys map[string]string)
	// StandbySlotsBlocking: how many slots synchronized_standby_slots names
	// hold the failover slot's walsender back (BlockingSlot).
	StandbySlotsBlocking(n int)
	// Unpublished: how many tables matching an outbox pattern the
	// publication does not publish wholly; their inserts are not streamed.
	Unpublished(tables int)
}

// MonitorConfig says what a Monitor watches.
type MonitorConfig struct {
	URL         string // a normal connection's; the stream's database
	Slot        string
	Publication string
	// Outboxes are the outbox tables configured by name, each with the
	// table found by it at start: the publication must publish both, if
	// they differ.
	Outboxes []MonitorOutbox
	// Patterns are the outboxes configured by a pattern: the publication
	// must publish every table that matches one now.
	Patterns []pgname.Pattern
	// Matched are the tables matching Patterns found at start (Entry:
	// the index in Patterns): one dropped before the first read is still
	// reported dropped.
	Matched  []OutboxTable
	Interval time.Duration // between two reads
}

// MonitorOutbox is an outbox table's configured name, and the table found by
// it at start.
type MonitorOutbox struct {
	Table  pgname.Name
	Outbox Relation
}

// Monitor reads the slot's state on a normal connection every interval:
// retained WAL, active, wal_status. The database's view is the one that
// matters when the streamer itself is stuck. It also checks that the
// publication still publishes the whole outbox, comparing relations: a
// table dropped and created again silently leaves it, and a partition or
// inheritance child the publication misses is never sent. It logs what
// changes, at the level the change deserves.
type Monitor struct {
	cfg       MonitorConfig
	obs       SlotObserver
	log       *slog.Logger
	published atomic.Bool

	// Run's goroutine's alone:
	conn       *pgx.Conn
	walStatus  string                 // as last read
	seenActive bool                   // the slot has read active at least once
	readiness  string                 // failover readiness as last logged
	blocking   string                 // the blocking standby slots as last logged
	matched    map[uint32]OutboxTable // tables matching a pattern, as last read
	temporary  map[uint32]bool        // temporary tables matching a pattern, as last read
}

// NewMonitor returns a monitor; Run starts it.
func NewMonitor(cfg MonitorConfig, obs SlotObserver, log *slog.Logger) *Monitor {
	m := &Monitor{cfg: cfg, obs: obs, log: log.With("component", "slot-monitor")}
	m.published.Store(true)
	if len(cfg.Matched) > 0 {
		m.matched = map[uint32]OutboxTable{}
		for _, t := range cfg.Matched {
			m.matched[t.OID] = t
		}
	}
	return m
}

// Published reports whether the publication publishes every insert into the
// outbox, as last read (true until read).
func (m *Monitor) Published() bool { return m.published.Load() }

// Run reads every interval until ctx ends. It never fails: a read that
// fails is logged and tried again at the next interval. The first read
// comes while the stream is still connecting, when the slot reads
// inactive; until it reads active, and for one interval at most, Run reads
// every second, so that the slot's metrics do not say "inactive" for a
// whole interval after a start while events stream.
func (m *Monitor) Run(ctx context.Context) {
	defer m.close()
	started := time.Now()
	for {
		m.check(ctx)
		wait := m.cfg.Interval
		if !m.seenActive && time.Since(started) < m.cfg.Interval {
			wait = min(wait, time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// check reads the slot and the publication once. Only Run's goroutine
// calls it: it owns the connection.
func (m *Monitor) check(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	info, err := m.read(rctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("could not read the replication slot's state", "slot", m.cfg.Slot, "error", err)
		}
		return
	}
	// The standbys have their own time: an unreachable one must not take
	// the slot's.
	fctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	m.failover(fctx, info)
}

// failover reads and reports failover readiness from the standbys' side,
// and what holds the walsender back on the primary's, saying each change
// once.
func (m *Monitor) failover(ctx context.Context, info SlotInfo) {
	r := FailoverReadiness(ctx, m.cfg.URL, m.cfg.Slot, info.Failover, info.ConfirmedFlush)
	states := map[string]string{}
	var attrs []any
	for _, s := range r.Standbys {
		states[s.Addr] = s.State
		detail := s.State
		switch {
		case s.Err != nil:
			detail += ": " + s.Err.Error()
		case s.BehindBytes > 0:
			detail += fmt.Sprintf(" (copy at %s, %d bytes behind)", s.ConfirmedFlush, s.BehindBytes)
		}
		attrs = append(attrs, "standby_"+s.Addr, detail)
	}
	m.obs.SlotFailover(info.Failover, r.Ready, states)
	if key := fmt.Sprint(r.Ready, r.Reason, states); key != m.readiness {
		first := m.readiness == ""
		m.readiness = key
		attrs = append([]any{"slot", m.cfg.Slot, "reason", r.Reason}, attrs...)
		switch {
		case r.Ready:
			m.log.Info("failover ready: every standby holds a synchronized, persistent copy of the slot close to its position", attrs...)
		case r.Reason == NotFailoverSlot || r.Reason == NoStandby:
			if !first {
				m.log.Info("failover readiness is not judged: "+r.Reason, attrs...)
			}
		default:
			m.log.Warn("not ready for a failover: a standby's copy of the slot is "+r.Reason+
				" (temporary: dropped at promotion; behind: events since its position are sent again; missing or unreachable: the stream stops at the failover)", attrs...)
		}
	}

	if !info.Failover || info.InRecovery {
		m.obs.StandbySlotsBlocking(0)
		return
	}
	blocking, err := blockingStandbySlots(ctx, m.conn)
	if err != nil {
		m.log.Warn("could not read synchronized_standby_slots", "error", err)
		return
	}
	m.obs.StandbySlotsBlocking(len(blocking))
	key := fmt.Sprint(blocking)
	if key == m.blocking {
		return
	}
	was := m.blocking
	m.blocking = key
	if len(blocking) == 0 {
		if was != "" && was != "[]" {
			m.log.Info("synchronized_standby_slots no longer holds the stream back", "synchronized_standby_slots", info.StandbySlots)
		}
		return
	}
	var names []string
	for _, b := range blocking {
		names = append(names, b.Name+" ("+b.Why+")")
	}
	m.log.Error("PostgreSQL holds the stream back: synchronized_standby_slots names standby slots without a standby streaming from them, "+
		"and the walsender of a failover slot sends nothing past what those standbys received, so events wait and the lag grows (after a promotion, "+
		"the new primary inherits the old one's setting). Fix: "+StandbySlotsFix(info.StandbySlots, blocking),
		"slot", m.cfg.Slot, "synchronized_standby_slots", info.StandbySlots, "blocking", strings.Join(names, ", "))
}

// read reads the slot and the publication and reports them; it returns
// the slot's state for failover.
func (m *Monitor) read(ctx context.Context) (SlotInfo, error) {
	if m.conn == nil || m.conn.IsClosed() {
		conn, err := connect(ctx, m.cfg.URL)
		if err != nil {
			return SlotInfo{}, err
		}
		m.conn = conn
	}
	info, err := ReadSlot(ctx, m.conn, m.cfg.Slot)
	switch {
	case errors.Is(err, ErrSlotMissing):
		m.obs.Slot(false, 0, "")
		return info, err
	case err != nil:
		return info, err
	}
	if info.Invalidated() {
		// Whatever the reason (17+: invalidation_reason; 16: conflicting),
		// the slot can no longer stream: as good as lost, which 16+ also
		// says in wal_status.
		info.WALStatus = "lost"
	}
	m.obs.Slot(info.Active, info.RetainedBytes, info.WALStatus)
	m.seenActive = m.seenActive || info.Active
	logWALStatus(m.log, m.walStatus, info)
	m.walStatus = info.WALStatus

	published := true
	for _, o := range m.cfg.Outboxes {
		problem, err := CheckPublication(ctx, m.conn, m.cfg.Publication, o.Outbox, o.Table)
		if err != nil {
			return info, err
		}
		if problem != "" {
			published = false
			m.log.Error("the outbox table is not in the publication, or not wholly: inserts into what is missing are not streamed. "+
				"Was it dropped and created again, or a partition added by hand? Fix it as the problem says, then re-publish the rows inserted meanwhile (cdc-outbox republish)",
				"problem", problem, "table", o.Table.String(), "publication", m.cfg.Publication)
		}
	}
	m.published.Store(published)
	return info, m.readPatterns(ctx)
}

// readPatterns checks that the publication publishes every table that
// matches an outbox pattern now. A table created while the publication's
// membership does not keep up (no event trigger, or one that missed it) is
// a gap: its inserts are not streamed until it is added. It is a warning at
// every read and a metric, never silence.
func (m *Monitor) readPatterns(ctx context.Context) error {
	if len(m.cfg.Patterns) == 0 {
		return nil
	}
	found, err := FindOutboxes(ctx, m.conn, m.cfg.Patterns)
	if err != nil {
		return err
	}
	unpublished := 0
	now := map[uint32]OutboxTable{}
	for _, t := range found {
		now[t.OID] = t
	}
	for oid, t := range m.matched {
		if _, ok := now[oid]; !ok {
			// Its rows committed before the drop are still in the WAL
			// and streamed; the other outboxes go on.
			m.log.Info("an outbox table was dropped (or renamed so that it matches no pattern): the other outboxes stream on",
				"table", t.Name.String(), "oid", oid, "pattern", m.cfg.Patterns[t.Entry].String())
		}
	}
	m.matched = now
	for _, t := range found {
		cov, err := Cover(ctx, m.conn, m.cfg.Publication, t.Table)
		if err != nil {
			return err
		}
		if t.Unlogged || !cov.Complete() {
			unpublished++
			m.log.Warn("a table matching an outbox pattern is not in the publication, or not wholly: inserts into what is missing are not streamed. "+
				"Fix it as the problem says (or install sql/outbox-membership.sql, which adds matching tables as they are created), then re-publish the rows inserted meanwhile (cdc-outbox republish)",
				"problem", cov.Problem(), "table", t.Name.String(), "pattern", m.cfg.Patterns[t.Entry].String(), "publication", m.cfg.Publication)
		}
	}
	m.obs.Unpublished(unpublished)
	return m.readTemporary(ctx)
}

// readTemporary says once of each temporary table that matches a pattern
// that it is not streamed: any session may create one ("CREATE TEMP TABLE
// outbox" under "*.outbox"), and its rows never reach the WAL.
func (m *Monitor) readTemporary(ctx context.Context) error {
	temps, err := FindTemporary(ctx, m.conn, m.cfg.Patterns)
	if err != nil {
		return err
	}
	now := map[uint32]bool{}
	for _, t := range temps {
		now[t.OID] = true
		if !m.temporary[t.OID] {
			m.log.Warn("a TEMPORARY table matches an outbox pattern: it is not streamed, because a temporary table is private to its session and its rows are never written to the WAL. "+
				"If it was meant as an outbox, create it as a permanent table",
				"table", t.Name.String(), "oid", t.OID, "pattern", m.cfg.Patterns[t.Entry].String())
		}
	}
	m.temporary = now
	return nil
}

func (m *Monitor) close() {
	if m.conn != nil {
		m.conn.Close(context.Background())
		m.conn = nil
	}
}

// logWALStatus says when the slot's wal_status changes, at the level the
// new state deserves. unreserved and lost are errors: the first is the last
// moment to act before PostgreSQL removes WAL the slot needs, the second
// means it did (streaming then stops with ErrWALLost at the latest when the
// walsender is ended and the stream reconnects, and that error says how to
// recover).
func logWALStatus(log *slog.Logger, prev string, info SlotInfo) {
	if info.WALStatus == prev {
		return
	}
	attrs := []any{"slot", info.Name, "wal_status", info.WALStatus, "previous", prev, "retained_wal_bytes", info.RetainedBytes}
	if reason := info.Reason(); reason != "" {
		attrs = append(attrs, "invalidation_reason", reason)
	}
	switch info.WALStatus {
	case "extended":
		log.Warn("the slot holds more WAL than max_wal_size: cdc-outbox is behind (is Kafka slow or refusing?)", attrs...)
	case "unreserved":
		log.Error("the slot holds more WAL than max_slot_wal_keep_size allows: the next checkpoint removes WAL it still needs, "+
			"and its events would never reach Kafka through it. Let cdc-outbox catch up (Kafka?) or raise max_slot_wal_keep_size now", attrs...)
	case "lost":
		what, _ := Invalidation(info.Reason())
		log.Error("the slot is invalidated: "+what+". The events it had not streamed will not reach Kafka through this slot; "+
			"cdc-outbox stops when the stream ends, saying how to recover", attrs...)
	case "reserved":
		if prev == "extended" || prev == "unreserved" {
			log.Info("the slot's WAL is within max_wal_size again", attrs...)
		}
	}
}
