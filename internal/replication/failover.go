package replication

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrOtherCluster means the replication connection reached a server of
// another cluster than the one cdc-outbox streamed from (another system
// identifier): not a standby of it, so its slot, if it has one of that name,
// is not the stream's.
var ErrOtherCluster = errors.New("the server belongs to another cluster")

// ErrBeyondFork means cdc-outbox read a position past the point where the
// new primary's timeline forked from the old one: the old primary streamed
// (or reported idle) WAL that the promoted standby never received, so that
// position means other WAL on the new timeline. Resuming there could skip
// transactions committed on the new primary; the slot's own position is
// safe, and a restart starts from it. A *ForkError has the facts.
var ErrBeyondFork = errors.New("the stream read past the new primary's fork from the old timeline")

// failover describes a move to a new primary, for messages.
type failover struct {
	from, to Server
	fork     pglogrepl.LSN // where the old timeline ends on the new one
}

// follow checks, on each new replication connection, that the server is
// the one streamed from before or a standby of it that was promoted since,
// and decides whether the stream may resume at the confirmed position
// there. It also reads the server's timeline history, which the Kafka
// checkpoint is judged by (History).
//
// A promotion starts a new timeline, which forks from the old one at a
// known LSN (TIMELINE_HISTORY). Up to the fork, both timelines hold the
// same WAL, so a position confirmed at or before it means the same on the
// new primary. The slot there (a failover slot the standby synchronized)
// is at or behind the position cdc-outbox confirmed, since the standby
// copies the primary's slot, which only cdc-outbox moves, and only
// periodically; START_REPLICATION then resumes at the confirmed position
// (PostgreSQL starts at the later of it and the slot's), so nothing
// acknowledged is sent again. With synchronized_standby_slots on the old
// primary, its walsender sent nothing the standby had not received, so
// nothing the stream read can lie past the fork. Without it, it can: the
// confirmed position, a transaction still waiting for Kafka's
// acknowledgement, or what Kafka committed in exactly-once delivery
// (Handler.Newest). Any of them past the fork names other WAL on the new
// timeline: confirmed there, or skipped as already in Kafka, it would pass
// over transactions committed on the new primary. So the stream stops with
// a *ForkError, confirming nothing on the new primary, and a restart
// begins at the slot's own position, which the standby only took from WAL
// it had.
func (s *Stream) follow(ctx context.Context, conn *pgconn.PgConn) error {
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	now := Server{SystemID: sys.SystemID, Timeline: sys.Timeline, Addr: conn.Conn().RemoteAddr().String()}
	was := s.server
	s.failover = nil
	ends := map[int32]pglogrepl.LSN{}
	if now.Timeline > 1 {
		h, err := pglogrepl.TimelineHistory(ctx, conn, now.Timeline)
		switch {
		case err == nil:
			ends = historyEnds(h.Content)
		case was.SystemID == now.SystemID && now.Timeline != was.Timeline:
			return fmt.Errorf("TIMELINE_HISTORY %d: %w", now.Timeline, err)
		default:
			// Without it, a Kafka checkpoint of an earlier timeline is
			// not proven to be on this history: it skips nothing.
			s.log.Warn("could not read the server's timeline history", "timeline", now.Timeline, "error", err)
		}
	}
	h := History{Timeline: now.Timeline, Ends: ends, Flushed: sys.XLogPos}
	s.mu.Lock()
	s.history = h
	s.mu.Unlock()
	confirmed := s.pos.Confirmed()
	v := Judge(Reconnection{Was: was, Now: now, History: h, Confirmed: confirmed, LastSent: s.lastSent, Newest: s.h.Newest()})
	switch e := v.Err.(type) {
	case nil:
	case *ForkError:
		s.log.Warn("lost history: cdc-outbox read the old primary's WAL past the fork of the new primary's timeline, which the promoted standby never received; "+
			"the events of that range in Kafka are not on the new primary, which commits other transactions at those positions and may hand out the same event ids again",
			"from", e.From, "from_timeline", e.FromTimeline, "to", e.To, "to_timeline", e.ToTimeline, "lost_from_lsn", e.Fork, "lost_to_lsn", e.Newest)
		return fatal{e}
	case *RestoreError:
		s.log.Warn("lost history: the server's WAL ends before what cdc-outbox read from it on this timeline: it was restored from a backup or a snapshot; "+
			"the events of that range in Kafka are not on it, and it commits other transactions at those positions",
			"server", e.Server, "timeline", e.Timeline, "server_flushed_lsn", e.Flushed, "confirmed_lsn", e.Confirmed, "newest_lsn", e.Newest)
		return fatal{e}
	default:
		return fatal{e}
	}
	s.server = now
	if v.FailedOver {
		s.failover = &failover{from: was, to: now, fork: v.Fork}
		s.log.Warn("PostgreSQL failed over: resuming on the new primary at the last confirmed position",
			"from", was.Addr, "from_timeline", was.Timeline, "to", now.Addr, "to_timeline", now.Timeline, "fork_lsn", v.Fork, "resume_lsn", confirmed)
	}
	return nil
}

// Server is what IDENTIFY_SYSTEM says of the server a connection reached.
type Server struct {
	SystemID string
	Timeline int32
	Addr     string
}

// Reconnection is what a new replication connection found (Now and its
// History) and what the stream had done before it: the server it streamed
// from (Was; zero on the first connection), the position it confirmed and
// last sent, and the newest position it handed on (Handler.Newest).
type Reconnection struct {
	Was, Now  Server
	History   History
	Confirmed pglogrepl.LSN
	LastSent  pglogrepl.LSN
	Newest    pglogrepl.LSN
}

// Verdict is Judge's answer. Err, when set, stops the stream for good:
// an *Error (ErrOtherCluster), a *ForkError or a *RestoreError. Otherwise
// the stream resumes at its confirmed position; FailedOver says that Now
// is a standby of Was promoted since, whose timeline forked at Fork.
type Verdict struct {
	Err        error
	FailedOver bool
	Fork       pglogrepl.LSN
}

// Judge decides whether the stream may resume at its confirmed position
// on the server a new connection reached. Pure: the simulation of the
// recovery protocol calls it as follow does.
//
//   - The first connection: yes (the start's recovery, Config.Holding,
//     judges what Kafka holds against the server).
//   - Another system: no, that server's slot is not the stream's.
//   - The same system and timeline is not the same WAL: a server put
//     back from a volume snapshot or a base backup without recovery (crash
//     recovery of itself) keeps both and goes on writing where its WAL
//     ends, with other transactions at the positions the stream read
//     before. Resumed at the confirmed position, the stream would skip
//     every one of them below it and write that position into the slot.
//     Anything the stream handed on (or confirmed, or sent) past the
//     server's flushed WAL, which a crash never takes back, says so: a
//     *RestoreError.
//   - A new timeline whose history holds the old one (a promotion): yes,
//     unless anything handed on lies past the fork (a *ForkError).
func Judge(r Reconnection) Verdict {
	was, now, h := r.Was, r.Now, r.History
	if was.SystemID == "" {
		return Verdict{}
	}
	if now.SystemID != was.SystemID {
		return Verdict{Err: &Error{Err: ErrOtherCluster, msg: fmt.Sprintf("%v: %s has system identifier %s, and cdc-outbox streamed from %s with %s before: "+
			"it is not a standby of that server, so it cannot continue the stream", ErrOtherCluster, now.Addr, now.SystemID, was.Addr, was.SystemID)}}
	}
	if now.Timeline == was.Timeline {
		if newest := max(r.Confirmed, r.LastSent, r.Newest); newest > h.Flushed {
			return Verdict{Err: &RestoreError{Server: now.Addr, Timeline: now.Timeline, Flushed: h.Flushed, Confirmed: r.Confirmed, Newest: newest}}
		}
		return Verdict{}
	}
	fork, ok := h.Ends[was.Timeline]
	if !ok {
		return Verdict{Err: &Error{Err: ErrOtherCluster, msg: fmt.Sprintf("%v: the history of timeline %d on %s does not contain timeline %d, which cdc-outbox streamed from on %s",
			ErrOtherCluster, now.Timeline, now.Addr, was.Timeline, was.Addr)}}
	}
	if newest := max(r.Confirmed, r.Newest); newest > fork {
		return Verdict{Err: &ForkError{From: was.Addr, FromTimeline: was.Timeline, To: now.Addr, ToTimeline: now.Timeline, Fork: fork, Confirmed: r.Confirmed, Newest: newest}}
	}
	return Verdict{FailedOver: true, Fork: fork}
}

// History is what IDENTIFY_SYSTEM and TIMELINE_HISTORY said of the server
// streamed from, on the last connection.
type History struct {
	Timeline int32
	// Ends is, for each earlier timeline of the history, the LSN at which
	// it ended (where the next one forked from it).
	Ends map[int32]pglogrepl.LSN
	// Flushed is the server's WAL flush position when the stream
	// connected.
	Flushed pglogrepl.LSN
}

// Timeline is the timeline of the server streamed from (0 before the first
// connection).
func (s *Stream) Timeline() int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.history.Timeline
}

// History is the WAL history of the server streamed from.
func (s *Stream) History() History {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.history
}

// ForkError: PostgreSQL failed over to a standby whose timeline forked from
// the old one at Fork, and the stream had read past it (Newest: confirmed,
// waiting for acknowledgements, or committed to Kafka): WAL the promoted
// standby never received. Errors.Is ErrBeyondFork.
type ForkError struct {
	From, To                 string // the old and the new primary's addresses
	FromTimeline, ToTimeline int32
	Fork                     pglogrepl.LSN
	Confirmed                pglogrepl.LSN // confirmed to the old primary
	Newest                   pglogrepl.LSN // the newest transaction's end handed on
}

func (e *ForkError) Error() string {
	return fmt.Sprintf("%v: PostgreSQL failed over from %s (timeline %d) to %s (timeline %d), whose timeline forks from the old one at %s, "+
		"and cdc-outbox had read the old primary's WAL up to %s (confirmed %s), which the promoted standby never received: the events of the WAL from %s to %s "+
		"that reached Kafka are of a lost history (set synchronized_standby_slots on the primary to rule this out). Nothing is confirmed on the new primary",
		ErrBeyondFork, e.From, e.FromTimeline, e.To, e.ToTimeline, e.Fork, e.Newest, e.Confirmed, e.Fork, e.Newest)
}

func (e *ForkError) Unwrap() error { return ErrBeyondFork }

// ErrRestored means the server streamed from, on the same system and
// timeline, has WAL only up to a position before what the stream read from
// it: it was put back from a backup or a snapshot. A *RestoreError has the
// facts.
var ErrRestored = errors.New("the server's WAL ends before what the stream read from it")

// RestoreError: on a new connection the server (same system identifier,
// same timeline) had WAL flushed only up to Flushed, and the stream had
// handed on transactions up to Newest (confirmed up to Confirmed) on it:
// the WAL from Flushed to Newest is of a history the server does not have.
// Nothing is confirmed on it; the stream stops, and a start begins at the
// slot's own position. Errors.Is ErrRestored.
type RestoreError struct {
	Server    string
	Timeline  int32
	Flushed   pglogrepl.LSN // the server's WAL flush position at the connection
	Confirmed pglogrepl.LSN // confirmed before the connection was lost
	Newest    pglogrepl.LSN // the newest position handed on (to Kafka, or confirmed)
}

func (e *RestoreError) Error() string {
	return fmt.Sprintf("%v: %s (timeline %d) has WAL up to %s, and cdc-outbox had read it up to %s (confirmed %s) before the connection was lost: "+
		"the server was restored from a backup or a snapshot, and the events Kafka got for the WAL from %s to %s are of a history it does not have. "+
		"Resuming at the confirmed position would skip what the server commits below it; nothing is confirmed on it",
		ErrRestored, e.Server, e.Timeline, e.Flushed, e.Newest, e.Confirmed, e.Flushed, e.Newest)
}

func (e *RestoreError) Unwrap() error { return ErrRestored }

// historyEnds reads a timeline history file (lines of "parentTLI
// switchpoint reason", tab-separated): the LSN at which each timeline of
// the history ended.
func historyEnds(history []byte) map[int32]pglogrepl.LSN {
	ends := map[int32]pglogrepl.LSN{}
	sc := bufio.NewScanner(bytes.NewReader(history))
	for sc.Scan() {
		fields := bytes.Fields(sc.Bytes())
		if len(fields) < 2 || fields[0][0] == '#' {
			continue
		}
		n, err := strconv.ParseInt(string(fields[0]), 10, 32)
		if err != nil {
			continue
		}
		if lsn, err := pglogrepl.ParseLSN(string(fields[1])); err == nil {
			ends[int32(n)] = lsn
		}
	}
	return ends
}

// slotGoneAfterFailover is a slot missing on the new primary.
func (s *Stream) slotGoneAfterFailover(cause error) error {
	f := s.failover
	return &Error{Err: ErrSlotGone, AfterFailover: true, Slot: s.cfg.Slot, Confirmed: s.pos.Confirmed(), Cause: cause,
		msg: fmt.Sprintf("%v: PostgreSQL failed over from %s (timeline %d) to %s (timeline %d), and replication slot %q does not exist on the new primary: "+
			"it was not synchronized to the standby before the promotion. PostgreSQL 17 and newer synchronize failover slots only "+
			"to a standby with sync_replication_slots = on, hot_standby_feedback = on and a primary_slot_name, "+
			"once the standby has caught up with the slot; PostgreSQL 14 to 16 keep no logical slot across a failover. "+
			"cdc-outbox does not create a new slot here: it would stream only what commits from then on and skip what was committed after "+
			"the last confirmed position %s (PostgreSQL said: %v)",
			ErrSlotGone, f.from.Addr, f.from.Timeline, f.to.Addr, f.to.Timeline, s.cfg.Slot, s.pos.Confirmed(), cause)}
}
