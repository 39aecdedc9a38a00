package checkpoint

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// Mark names the commit a Kafka checkpoint was written after: its end LSN
// (the checkpoint's position), the timeline the stream read it on, and the
// transaction's xid and commit time. An LSN alone is not a place in one
// history: a promoted standby continues the WAL on a new timeline from its
// fork, and a cluster restored from a base backup continues it on the same
// timeline with other transactions, so the same LSN may name other WAL.
// The commit the mark names is what tells them apart: the stream reaches
// that LSN again and sees whether the same transaction committed there.
type Mark struct {
	End        pglogrepl.LSN
	Timeline   int32     // 0: not recorded (a checkpoint of an older version)
	Xid        uint32    // of the transaction that ended at End
	CommitTime time.Time // its commit time; zero when not recorded
	Epoch      int       // the history epoch its events were published in (Epoch)
	// Named is where the named transaction ends when before End (0: at
	// End): the checkpoint lies past the last commit, at a lone message's
	// dead-letter record, and nothing commits between the two.
	Named pglogrepl.LSN
}

// CommitEnd is where the transaction the mark names ends: End, or Named
// when the checkpoint lies at a lone message after it.
func (m Mark) CommitEnd() pglogrepl.LSN {
	if m.Named != 0 && m.Named < m.End {
		return m.Named
	}
	return m.End
}

// Known reports whether the mark names a commit the stream can check.
func (m Mark) Known() bool { return m.Timeline != 0 && !m.CommitTime.IsZero() }

// Is reports whether the transaction that ended at end with xid and
// commitTime is the one the mark names (ending at Named when set). Two
// transactions with the same xid and the same commit time, to the
// microsecond, ending at the same LSN on two histories do not happen: xids
// repeat after a fork, but the clock has moved on.
func (m Mark) Is(end pglogrepl.LSN, xid uint32, commitTime time.Time) bool {
	return m.Known() && end == m.CommitEnd() && xid == m.Xid && commitTime.Equal(m.CommitTime)
}

// Trust is what a checkpoint lets the stream skip on the server it streams
// from.
type Trust struct {
	// Skip: transactions that ended at or before it are in Kafka for sure
	// (the WAL up to a fork is the same on both timelines); skip them.
	Skip pglogrepl.LSN
	// Verify: the mark's commit is on the server's timeline or before its
	// fork. Skip the transactions up to the mark only once the stream
	// reaches the mark's commit and it is the same transaction; until
	// then nothing may be confirmed past the position the stream started
	// at, so that they are sent again if it is not.
	Verify bool
	// Lost: the checkpoint lies on WAL the server never had, so Kafka
	// holds events of a history that was lost: from LostFrom (the fork;
	// 0 when not known) to the mark's End.
	Lost     bool
	LostFrom pglogrepl.LSN
	// Why says, when nothing may be skipped without verification, why.
	Why string
}

// Decide says what a checkpoint written after the commit m lets the stream
// skip on a server whose timeline is timeline, with ends the LSN at which
// each earlier timeline of its history ended (TIMELINE_HISTORY: the fork
// of the next one), and whose WAL is flushed up to flushed
// (IDENTIFY_SYSTEM).
//
//   - m on the server's timeline: verify (a restore keeps the timeline).
//   - m on an earlier timeline of the history, at or before its end: the
//     same WAL on both; verify (the commit is sent again as it was).
//   - either, past the server's flushed WAL: the server never had that
//     commit (it was decoded from flushed WAL only), and no verification
//     could end before the server writes that far, holding back what it
//     commits meanwhile; skip nothing.
//   - m on an earlier timeline past its end: the history forked before
//     the checkpoint. Skip up to the fork, nothing beyond: the server's
//     transactions after the fork are others, at positions that overlap.
//   - a mark without a timeline (an older record), or on a timeline that
//     is not in the server's history: skip nothing.
func Decide(m Mark, timeline int32, ends map[int32]pglogrepl.LSN, flushed pglogrepl.LSN) Trust {
	end, inHistory := ends[m.Timeline]
	switch {
	case !m.Known() && m.End > flushed:
		// Named or not, a position the server's WAL does not reach is
		// on another history.
		return Trust{Lost: true,
			Why: fmt.Sprintf("the checkpoint, which names no commit, lies past the server's WAL, flushed up to %s: it was written on another history (a restore, or a standby started as a primary)", flushed)}
	case !m.Known() && m.Timeline != 0 && m.Timeline != timeline && inHistory && m.End > end:
		return Trust{Lost: true, LostFrom: end,
			Why: fmt.Sprintf("the checkpoint, which names no commit, was written on timeline %d past its end at %s, where the server's timeline %d forked from it", m.Timeline, end, timeline)}
	case !m.Known():
		return Trust{Why: "the checkpoint was written by an older version of cdc-outbox and does not name its timeline and commit"}
	case m.Timeline != timeline && !inHistory:
		return Trust{Why: fmt.Sprintf("the checkpoint was written on timeline %d, which is not in the history of the server's timeline %d", m.Timeline, timeline)}
	case m.Timeline != timeline && m.End > end:
		return Trust{Skip: end, Lost: true, LostFrom: end,
			Why: fmt.Sprintf("the checkpoint was written on timeline %d past its end at %s, where the server's timeline %d forked from it", m.Timeline, end, timeline)}
	case m.End > flushed:
		return Trust{Lost: true,
			Why: fmt.Sprintf("the checkpoint lies past the server's WAL, flushed up to %s: it was written on another history (a restore, or a standby started as a primary)", flushed)}
	}
	return Trust{Verify: true}
}
