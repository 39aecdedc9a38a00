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

// ErrBeyondFork means cdc-outbox confirmed a position past the point where
// the new primary's timeline forked from the old one: the old primary
// streamed (or reported idle) WAL that the promoted standby never received,
// so that position means other WAL on the new timeline. Resuming there
// could skip transactions committed on the new primary; the slot's own
// position is safe, and a restart starts from it.
var ErrBeyondFork = errors.New("the confirmed position is past the new primary's fork from the old timeline")

// server is what IDENTIFY_SYSTEM says of the server a session streams from.
type server struct {
	systemID string
	timeline int32
	addr     string
}

// failover describes a move to a new primary, for messages.
type failover struct {
	from, to server
	fork     pglogrepl.LSN // where the old timeline ends on the new one
}

// follow checks, on each new replication connection, that the server is
// the one streamed from before or a standby of it that was promoted since,
// and decides whether the stream may resume at the confirmed position
// there.
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
// the confirmed position cannot lie past the fork. Without it, it can:
// then ErrBeyondFork stops the stream, because that position names other
// WAL on the new timeline, and a restart begins at the slot's own
// position, which the standby only took from WAL it had.
func (s *Stream) follow(ctx context.Context, conn *pgconn.PgConn) error {
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	now := server{systemID: sys.SystemID, timeline: sys.Timeline, addr: conn.Conn().RemoteAddr().String()}
	was := s.server
	s.failover = nil
	switch {
	case was.systemID == "":
		s.server = now
		return nil
	case now.systemID != was.systemID:
		return fatal{fmt.Errorf("%w: %s has system identifier %s, and cdc-outbox streamed from %s with %s before: it is not a standby of that server, "+
			"so it cannot continue the stream; check --postgres-url", ErrOtherCluster, now.addr, now.systemID, was.addr, was.systemID)}
	case now.timeline == was.timeline:
		s.server = now
		return nil
	}
	h, err := pglogrepl.TimelineHistory(ctx, conn, now.timeline)
	if err != nil {
		return fmt.Errorf("TIMELINE_HISTORY %d: %w", now.timeline, err)
	}
	fork, ok := switchpoint(h.Content, was.timeline)
	if !ok {
		return fatal{fmt.Errorf("%w: the history of timeline %d on %s does not contain timeline %d, which cdc-outbox streamed from on %s; "+
			"check --postgres-url", ErrOtherCluster, now.timeline, now.addr, was.timeline, was.addr)}
	}
	f := &failover{from: was, to: now, fork: fork}
	if confirmed := s.pos.Confirmed(); confirmed > fork {
		return fatal{fmt.Errorf("%w: PostgreSQL failed over from %s (timeline %d) to %s (timeline %d), whose timeline forks from the old one at %s, "+
			"and cdc-outbox confirmed %s on the old primary, WAL the promoted standby never received (set synchronized_standby_slots on the primary "+
			"to rule this out). Start cdc-outbox again: it resumes at the slot's position on the new primary, which is safe; "+
			"events between the two may be delivered again",
			ErrBeyondFork, was.addr, was.timeline, now.addr, now.timeline, fork, confirmed)}
	}
	s.server, s.failover = now, f
	s.log.Warn("PostgreSQL failed over: resuming on the new primary at the last confirmed position",
		"from", was.addr, "from_timeline", was.timeline, "to", now.addr, "to_timeline", now.timeline, "fork_lsn", fork, "resume_lsn", s.pos.Confirmed())
	return nil
}

// switchpoint finds in a timeline history file (lines of "parentTLI
// switchpoint reason", tab-separated) the LSN at which timeline tli ended.
func switchpoint(history []byte, tli int32) (pglogrepl.LSN, bool) {
	sc := bufio.NewScanner(bytes.NewReader(history))
	for sc.Scan() {
		fields := bytes.Fields(sc.Bytes())
		if len(fields) < 2 || fields[0][0] == '#' {
			continue
		}
		n, err := strconv.ParseInt(string(fields[0]), 10, 32)
		if err != nil || int32(n) != tli {
			continue
		}
		lsn, err := pglogrepl.ParseLSN(string(fields[1]))
		return lsn, err == nil
	}
	return 0, false
}

// slotGoneAfterFailover explains a slot missing on the new primary.
func (s *Stream) slotGoneAfterFailover(cause error) error {
	f := s.failover
	return fmt.Errorf("%w: PostgreSQL failed over from %s (timeline %d) to %s (timeline %d), and replication slot %q does not exist on the new primary: "+
		"it was not synchronized to the standby before the promotion. PostgreSQL 17 and newer synchronize failover slots only "+
		"(--slot-failover, the default) to a standby with sync_replication_slots = on, hot_standby_feedback = on and a primary_slot_name, "+
		"once the standby has caught up with the slot; PostgreSQL 14 to 16 keep no logical slot across a failover. "+
		"cdc-outbox does not create a new slot here: it would stream only what commits from then on and skip what was committed after "+
		"the last confirmed position %s. To recover: start cdc-outbox once with --recreate-slot (a new slot, streaming from its creation on), "+
		"then re-publish the events committed since the last one Kafka has with cdc-outbox republish --after-id <id> (or --since <time>); "+
		"consumers skip the repeats by event id. See High availability in the README (PostgreSQL said: %w)",
		ErrSlotGone, f.from.addr, f.from.timeline, f.to.addr, f.to.timeline, s.cfg.Slot, s.pos.Confirmed(), cause)
}
