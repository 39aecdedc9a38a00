package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// checkpointValue is a checkpoint record's value: the end LSN of the last
// PostgreSQL transaction whose records the same Kafka transaction (or an
// earlier one) holds, and the outbox table's identity (system identifier,
// database and table OIDs), without which an LSN means nothing: another
// cluster's WAL, or a restored one's, has its own positions.
//
// Timeline, Xid and CommitTime name that transaction in its WAL history:
// the timeline it was streamed on, its xid and its commit time (unix
// microseconds, as PostgreSQL keeps it). A promoted standby and a restored
// base backup keep the system identifier and reuse LSNs; these say whether
// the LSN is the same commit there. Records written before they existed
// have none (zero): such a checkpoint cannot be verified.
//
// Epoch is the history epoch the transaction's events were published in
// (checkpoint.Epoch; 0, omitted, for the first history): a restored
// cluster goes on with other transactions at the same LSNs, below the lost
// history's checkpoints, and the epoch says which is the later.
type checkpointValue struct {
	LSN        string `json:"lsn"`
	Origin     string `json:"origin"`
	Timeline   int32  `json:"timeline,omitempty"`
	Xid        uint32 `json:"xid,omitempty"`
	CommitTime int64  `json:"commit_time_us,omitempty"`
	Epoch      int    `json:"epoch,omitempty"`
	// CommitLSN, when before LSN, is where the transaction Xid and
	// CommitTime name ends: the checkpoint lies past the last commit, at a
	// lone message's dead-letter record (written in the Kafka transaction),
	// and a later start verifies that commit, then skips through LSN.
	CommitLSN string `json:"commit_lsn,omitempty"`
}

// Commit is the PostgreSQL transaction a checkpoint is written after.
type Commit struct {
	End        pglogrepl.LSN // its end LSN: the checkpoint's position
	Timeline   int32
	Xid        uint32
	CommitTime time.Time
	Epoch      int // the history epoch its events were published in
	// Named is the end of the transaction Xid and CommitTime name when it
	// is before End (0: it ends at End).
	Named pglogrepl.LSN
}

// CheckpointRecord is the checkpoint record of key (the slot) at lsn of the
// table origin, naming no commit: as an older version wrote it.
func CheckpointRecord(topic, key, origin string, lsn pglogrepl.LSN) *kgo.Record {
	return CheckpointRecordAt(topic, key, origin, Commit{End: lsn})
}

// CheckpointRecordAt is the checkpoint record of key (the slot) after the
// commit at of the table origin.
func CheckpointRecordAt(topic, key, origin string, at Commit) *kgo.Record {
	v := checkpointValue{LSN: at.End.String(), Origin: origin, Timeline: at.Timeline, Xid: at.Xid, Epoch: at.Epoch}
	if !at.CommitTime.IsZero() {
		v.CommitTime = at.CommitTime.UnixMicro()
	}
	if at.Named != 0 && at.Named < at.End {
		v.CommitLSN = at.Named.String()
	}
	b, _ := json.Marshal(v) // strings and numbers always encode
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: b}
}

// ParseCheckpoint reads a checkpoint record's value.
func ParseCheckpoint(value []byte) (lsn pglogrepl.LSN, origin string, err error) {
	at, origin, err := parseCheckpoint(value)
	return at.End, origin, err
}

// parseCheckpoint reads a checkpoint record's value with the commit it
// names.
func parseCheckpoint(value []byte) (at Commit, origin string, err error) {
	var v checkpointValue
	if err := json.Unmarshal(value, &v); err != nil {
		return Commit{}, "", fmt.Errorf("checkpoint record %q: %w", value, err)
	}
	lsn, err := pglogrepl.ParseLSN(v.LSN)
	if err != nil {
		return Commit{}, "", fmt.Errorf("checkpoint record %q: %w", value, err)
	}
	at = Commit{End: lsn, Timeline: v.Timeline, Xid: v.Xid, Epoch: v.Epoch}
	if v.CommitTime != 0 {
		at.CommitTime = time.UnixMicro(v.CommitTime).UTC()
	}
	if v.CommitLSN != "" {
		if at.Named, err = pglogrepl.ParseLSN(v.CommitLSN); err != nil {
			return Commit{}, "", fmt.Errorf("checkpoint record %q: %w", value, err)
		}
	}
	return at, v.Origin, nil
}

// Checkpoint is what the checkpoint topic says of one key.
type Checkpoint struct {
	LSN   pglogrepl.LSN // 0 when Found is false
	Found bool
	// Origin is the identity of the outbox table whose WAL LSN is a
	// position in.
	Origin string
	// At is the record's timestamp: when its transaction was written.
	At time.Time
	// Commit names the PostgreSQL transaction at LSN in its WAL history;
	// its Timeline is 0 in a record of an older version.
	Commit Commit
	// Epochs is the value of the stream's epochs record (EpochsKey), found
	// with a checkpoint or without: nil when no history of it was lost.
	// Published is the value of its published record (PublishedKey): nil
	// unless it streamed in at-least-once delivery.
	Epochs, Published []byte
}

// checkpointPartitions is the checkpoint topic's partition count when
// cdc-outbox creates it: one, because it holds one record per slot.
const checkpointPartitions = 1

// EnsureCheckpointTopic creates the checkpoint topic, compacted, when it is
// missing. Compaction keeps the last record of each key (slot) for good, so
// the position survives any retention; segments roll hourly so older
// checkpoints are cleaned away.
func EnsureCheckpointTopic(ctx context.Context, cfg Config, topic string) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.Opts...)...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	policy, segment := "compact", "3600000"
	resp, err := adm.CreateTopic(ctx, checkpointPartitions, -1, map[string]*string{"cleanup.policy": &policy, "segment.ms": &segment}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return &CheckpointError{Topic: topic, Op: "create the checkpoint topic", Err: err}
	}
	return nil
}

// ReadCheckpoint reads the checkpoint topic to its end and returns the
// committed checkpoint of key written by origin with the highest LSN (and
// the stream's history epochs, EpochsKey), on
// whichever partition it lies: a record of another origin under the same
// key (another cluster that used the same name) says nothing of this
// stream, and positions only grow, so the highest is the latest. Call it
// after Fence, so that no transaction of this transactional id is left
// undecided.
//
// It does not read as a read_committed consumer does: that consumer stops
// at the last stable offset, which any open transaction on the partition
// holds back, and the topic is shared by every stream (a killed instance of
// another one leaves its transaction open until the broker times it out).
// It reads everything to the high watermark instead, with the transaction
// markers, and takes a checkpoint only once its producer's commit marker
// follows it; an aborted or undecided one is passed over.
//
// Found is false only when Kafka said so: every partition was read up to
// the end offset the broker listed. A broker that is slow to answer is
// waited for until ctx ends, which is an error naming the partitions not
// read to their end, never an empty checkpoint (which would send again
// everything since the slot's position).
func ReadCheckpoint(ctx context.Context, cfg Config, topic, key, origin string) (Checkpoint, error) {
	fail := func(op string, err error) (Checkpoint, error) {
		return Checkpoint{}, &CheckpointError{Topic: topic, Op: op, Err: err}
	}
	admCl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.Opts...)...)
	if err != nil {
		return fail("connect", err)
	}
	defer admCl.Close()
	ends, err := kadm.NewClient(admCl).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fail("list its end offsets", err)
	}
	// The offset of the last record (data or transaction marker) of each
	// partition. The last record is never compacted away (the log cleaner
	// leaves the active segment alone), so reading it is reading to the end.
	parts := map[int32]kgo.Offset{}
	last := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			parts[o.Partition] = kgo.NewOffset().AtStart()
			last[o.Partition] = o.Offset - 1
		}
	})
	var cp Checkpoint
	if len(last) == 0 {
		return cp, nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(time.Second),
	}, cfg.Opts...)...)
	if err != nil {
		return fail("connect", err)
	}
	defer cl.Close()
	// A transactional producer's checkpoint waits here for its marker.
	pending := map[int64]Checkpoint{}
	epochsKey, publishedKey := EpochsKey(key), PublishedKey(key)
	var epochs, published []byte
	for len(last) > 0 {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return fail("read it", &ShortReadError{Unread: last, Err: ctx.Err()})
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) {
			if ferr == nil {
				ferr = err
			}
		})
		if ferr != nil {
			return fail("read it", ferr)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if end, ok := last[r.Partition]; ok && r.Offset >= end {
				delete(last, r.Partition)
			}
			switch {
			case r.Attrs.IsControl():
				// The key of a transaction marker: version, then type
				// (0 abort, 1 commit), two bytes each.
				if p, ok := pending[r.ProducerID]; ok {
					if len(r.Key) >= 4 && r.Key[3] == 1 && p.Supersedes(cp) {
						cp = p
					}
					delete(pending, r.ProducerID)
				}
			// One partition has a key's records, the last the latest.
			case string(r.Key) == epochsKey:
				epochs = r.Value
			case string(r.Key) == publishedKey:
				published = r.Value
			case string(r.Key) != key:
			default:
				at, o, perr := parseCheckpoint(r.Value)
				if perr != nil {
					err = perr
					return
				}
				if o != origin {
					return
				}
				c := Checkpoint{LSN: at.End, Found: true, Origin: o, At: r.Timestamp, Commit: at}
				switch {
				case r.Attrs.IsTransactional():
					pending[r.ProducerID] = c
				case c.Supersedes(cp):
					cp = c
				}
			}
		})
		if err != nil {
			return fail("read it", err)
		}
	}
	cp.Epochs, cp.Published = epochs, published
	return cp, nil
}

// Supersedes reports whether c is a later checkpoint of the stream than
// o. Positions grow along one history, so the higher LSN is the later one;
// but a promotion starts a new timeline whose LSNs go on from its fork,
// below what the lost history's checkpoints may have reached: a checkpoint
// of a newer timeline is the later one whatever its LSN, or a lost
// history's checkpoint would be read (and refuted, skipping nothing) at
// every start until the new history passed its LSN. A checkpoint without a
// timeline (written by a former version) has timeline 0. A later history
// epoch comes before both: a restore goes on with the same timeline below
// the lost history's positions.
func (c Checkpoint) Supersedes(o Checkpoint) bool {
	if !o.Found {
		return true
	}
	if c.Commit.Epoch != o.Commit.Epoch {
		return c.Commit.Epoch > o.Commit.Epoch
	}
	if c.Commit.Timeline != o.Commit.Timeline {
		return c.Commit.Timeline > o.Commit.Timeline
	}
	return c.LSN >= o.LSN
}

// ShortReadError is the checkpoint topic not read to its end: the
// partitions in Unread (each with the offset of its last record) were
// still short of it when Err (the deadline) ended the read.
type ShortReadError struct {
	Unread map[int32]int64
	Err    error
}

func (e *ShortReadError) Error() string {
	ps := make([]string, 0, len(e.Unread))
	for p, end := range e.Unread {
		ps = append(ps, fmt.Sprintf("%d (to offset %d)", p, end))
	}
	slices.Sort(ps)
	return fmt.Sprintf("the broker did not deliver partitions %s to their end: %v", strings.Join(ps, ", "), e.Err)
}

func (e *ShortReadError) Unwrap() error { return e.Err }

// CheckpointError is a failure to create or read the checkpoint topic.
type CheckpointError struct {
	Topic string
	Op    string
	Err   error
}

func (e *CheckpointError) Error() string {
	return fmt.Sprintf("checkpoint topic %s: %s: %v", e.Topic, e.Op, e.Err)
}

func (e *CheckpointError) Unwrap() error { return e.Err }
