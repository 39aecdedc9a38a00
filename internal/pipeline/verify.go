package pipeline

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
)

// Verify has the pipeline, in exactly-once delivery, skip the transactions
// up to the Kafka checkpoint's commit m only once it is proven that the
// server's WAL holds that commit: that the stream reaches a transaction
// ending at m.End with m's xid and commit time. Until then the transactions
// before it are skipped tentatively: none is committed to the tracker, and
// keepalives are held (Tracker.Hold), so the confirmed position stays
// where the stream started. If the server has another transaction there,
// or none, the checkpoint is of another history (a restored base backup
// goes on with other transactions at the same LSNs): WAL returns an
// *UnverifiedError, the stream reads again from the position it started
// at, and this time nothing is skipped. A checkpoint at or before that
// position needs no proof: the server sends nothing it could skip.
//
// Call it from the replication goroutine, before the first message.
//
// A checkpoint at a lone message's dead-letter record (m.Named) whose
// named commit is at or before that position (the process stopped after
// the record's Kafka commit and before the slot was told) cannot be met
// again: the server sends only the message. It is verified by the message
// itself, met at the checkpoint's position with no commit before it
// (verifyLone).
func (p *Pipeline) Verify(m checkpoint.Mark) {
	eo, ok := p.d.(*exactlyOnce)
	if !ok || m.End <= p.ckpt.Confirmed() {
		return
	}
	eo.verify = &m
	eo.namedPassed = m.CommitEnd() < m.End && m.CommitEnd() <= p.ckpt.Confirmed()
	p.ckpt.Hold(true)
}

// Newest is how far what was handed to Kafka, or may be confirmed,
// reaches into the WAL: the end LSN of the newest transaction the stream
// took the commit of, or that the Kafka checkpoint holds (exactly-once),
// or, in at-least-once delivery, the newest change produced of a
// transaction whose commit has not come yet (a large one cut off mid-way:
// its records are in Kafka all the same). A failover to a standby whose
// timeline forked before it, or a server whose WAL ends before it, finds a
// history lost. Call it from the replication goroutine.
func (p *Pipeline) Newest() pglogrepl.LSN { return max(p.HandedOn(), p.d.reach()) }

// Holds says, in exactly-once delivery, that Kafka holds events up to lsn
// by a checkpoint the stream skips nothing by (one that cannot be
// verified): they count in Newest all the same, so that a server found
// later with its WAL ending before them (a restore) is a lost history.
// Call it from the replication goroutine.
func (p *Pipeline) Holds(lsn pglogrepl.LSN) {
	if eo, ok := p.d.(*exactlyOnce); ok {
		eo.holds = max(eo.holds, lsn)
	}
}

// HandedOn is the newest position handed on: the end of the newest
// transaction committed to the tracker, or the newest change produced in
// at-least-once delivery, whichever is later. The published record says
// it (at-least-once). Safe from any goroutine.
func (p *Pipeline) HandedOn() pglogrepl.LSN {
	n := p.ckpt.Newest()
	if a, ok := p.d.(*atLeastOnce); ok {
		n = max(n, pglogrepl.LSN(a.newest.Load()))
	}
	return n
}

// verifyBegin decides on a transaction whose commit record starts at final
// while the checkpoint is not verified: skipped tentatively (skip) if it
// ends before the checkpoint's commit, which it may be; otherwise the
// stream has passed the checkpoint without meeting its commit.
func (e *exactlyOnce) verifyBegin(final pglogrepl.LSN) (skip bool, err error) {
	// Nothing commits between a lone message's checkpoint's named commit
	// and the message: a transaction there refutes it.
	if final < e.verify.CommitEnd() && !e.namedPassed {
		e.unproven = true
		return true, nil
	}
	return false, e.refute(final, 0, time.Time{}, e.tentative)
}

// verifyLone decides on a non-transactional message at at while the
// checkpoint is not verified. Before the checkpoint's position, Kafka holds
// its dead-letter record if the checkpoint is on this history: it is
// skipped tentatively like a transaction (skip reports true), and met again
// if the checkpoint is refuted. It must never end a Kafka transaction or
// move the confirmed position of its own now, which would confirm past the
// transactions skipped tentatively before it. At the position of a
// checkpoint written at this message, with the named commit passed before
// the stream started, it verifies the checkpoint. Past it, or at it
// otherwise, the stream passed the checkpoint without meeting its commit:
// refuted, and the message is then set aside as usual (skip false), unless
// transactions skipped tentatively must be read again first.
func (e *exactlyOnce) verifyLone(at pglogrepl.LSN) (skip bool, err error) {
	m, p := e.verify, e.p
	switch {
	case at < m.End && e.namedPassed:
		// Another lone message between the named commit and the one the
		// checkpoint was written at: held like a transaction until the
		// checkpoint is verified (no transaction is skipped tentatively
		// while namedPassed: any refutes it).
		e.tentative++
		return true, nil
	case at == m.End && e.namedPassed:
		e.verify, e.namedPassed, e.tentative = nil, false, 0
		e.through = max(e.through, m.End)
		p.ckpt.Hold(false)
		p.log.Info("skipping a non-transactional message whose dead-letter record Kafka holds already (exactly-once): the Kafka checkpoint was written at it, "+
			"after the commit it names, which this server's slot had confirmed", "checkpoint_lsn", m.End, "named_commit_lsn", m.Named, "xid", m.Xid)
		return true, nil
	case at < m.CommitEnd() && !e.namedPassed:
		e.tentative++
		return true, nil
	}
	return false, e.refute(at, 0, time.Time{}, e.tentative)
}

// verifyCommit ends a tentatively skipped transaction that ended at end.
// It is the checkpoint's commit: verified, and every transaction skipped
// tentatively was in Kafka; it goes on to the tracker's Commit, which
// confirms it. It ends before: it stays skipped tentatively, out of the
// tracker (tentative reports true). Otherwise the checkpoint is refuted.
func (e *exactlyOnce) verifyCommit(end pglogrepl.LSN, xid uint32) (tentative bool, err error) {
	p := e.p
	m, at := e.verify, time.Unix(0, p.commitTime).UTC()
	e.unproven = false
	switch {
	case m.Is(end, xid, at):
		e.verify = nil
		e.through = max(e.through, m.End)
		p.ckpt.Hold(false)
		e.skippedTx.Add(e.tentative + 1)
		p.log.Info("skipping transactions that Kafka holds already (exactly-once): the Kafka checkpoint's commit is on this server's history, "+
			"so the transactions up to it that PostgreSQL sent again are in Kafka",
			"checkpoint_lsn", m.End, "xid", m.Xid, "commit_time", m.CommitTime, "skipped", e.tentative+1)
		e.tentative = 0
		return false, nil
	case end < m.CommitEnd() && !e.namedPassed:
		e.tentative++
		p.skipping = false
		p.ckpt.Discard(p.tx)
		p.tx = nil
		return true, nil
	}
	// This transaction's rows were skipped too.
	return false, e.refute(end, xid, at, e.tentative+1)
}

// refute ends the verification: the stream reached at without meeting the
// checkpoint's commit, after skipping skipped transactions tentatively,
// which are read again.
func (e *exactlyOnce) refute(at pglogrepl.LSN, xid uint32, commitTime time.Time, skipped uint64) error {
	p := e.p
	m := *e.verify
	e.verify, e.unproven, e.tentative, e.namedPassed = nil, false, 0, false
	p.skipping = false
	p.ckpt.Hold(false)
	p.obs.LostHistory()
	found := "no commit there"
	if xid != 0 {
		found = fmt.Sprintf("transaction %d committed at %s ending at %s", xid, commitTime.Format(time.RFC3339Nano), at)
	}
	p.log.Warn("exactly-once delivery: the Kafka checkpoint is not on this server's WAL history (a restore from a base backup, or a failover past what the standby had): "+
		"nothing is skipped, and the events Kafka holds of the WAL up to the checkpoint's position are of a lost history; consumers may meet their ids again on other events",
		"checkpoint_lsn", m.End, "checkpoint_timeline", m.Timeline, "checkpoint_xid", m.Xid, "checkpoint_commit_time", m.CommitTime,
		"stream_start_lsn", p.ckpt.Confirmed(), "found", found)
	if err := p.lostHere(m); err != nil {
		return err
	}
	if skipped == 0 {
		return nil // nothing was skipped: nothing to read again
	}
	return &UnverifiedError{Checkpoint: m, At: at, Skipped: skipped}
}

// UnverifiedError: the stream skipped transactions before the Kafka
// checkpoint, tentatively, and then found that the server's WAL does not
// hold the checkpoint's commit. The stream reads them again from the
// position it started at, on a new connection, and publishes them.
type UnverifiedError struct {
	Checkpoint checkpoint.Mark
	At         pglogrepl.LSN // where the stream passed it
	Skipped    uint64        // transactions skipped tentatively up to At, to read again
}

func (e *UnverifiedError) Error() string {
	return fmt.Sprintf("the Kafka checkpoint at %s (transaction %d of timeline %d) is not on this server's WAL history: the stream passed it at %s; "+
		"reading again the %d transactions skipped up to there", e.Checkpoint.End, e.Checkpoint.Xid, e.Checkpoint.Timeline, e.At, e.Skipped)
}

// Resend tells the replication stream to read again from its confirmed
// position on a new connection, rather than stop.
func (e *UnverifiedError) Resend() bool { return true }
