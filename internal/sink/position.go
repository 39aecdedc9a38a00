package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
type checkpointValue struct {
	LSN    string `json:"lsn"`
	Origin string `json:"origin"`
}

// CheckpointRecord is the checkpoint record of key (the slot) at lsn of the
// table origin.
func CheckpointRecord(topic, key, origin string, lsn pglogrepl.LSN) *kgo.Record {
	v, _ := json.Marshal(checkpointValue{LSN: lsn.String(), Origin: origin}) // strings always encode
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: v}
}

// ParseCheckpoint reads a checkpoint record's value.
func ParseCheckpoint(value []byte) (lsn pglogrepl.LSN, origin string, err error) {
	var v checkpointValue
	if err := json.Unmarshal(value, &v); err != nil {
		return 0, "", fmt.Errorf("checkpoint record %q: %w", value, err)
	}
	if lsn, err = pglogrepl.ParseLSN(v.LSN); err != nil {
		return 0, "", fmt.Errorf("checkpoint record %q: %w", value, err)
	}
	return lsn, v.Origin, nil
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

// ReadCheckpoint reads the checkpoint topic to its end, as a
// read_committed consumer does, and returns the last checkpoint of key.
// Call it after Fence: a transaction the previous instance left open is
// aborted then, so the last stable offset is the end of what was committed.
func ReadCheckpoint(ctx context.Context, cfg Config, topic, key string) (Checkpoint, error) {
	fail := func(op string, err error) (Checkpoint, error) {
		return Checkpoint{}, &CheckpointError{Topic: topic, Op: op, Err: err}
	}
	admCl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.Opts...)...)
	if err != nil {
		return fail("connect", err)
	}
	defer admCl.Close()
	ends, err := kadm.NewClient(admCl).ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fail("list its last stable offsets", err)
	}
	// The offset of the last record (data or transaction marker) below
	// each partition's last stable offset.
	want := map[int32]map[int32]kgo.Offset{}
	last := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			if want[0] == nil {
				want[0] = map[int32]kgo.Offset{}
			}
			want[0][o.Partition] = kgo.NewOffset().AtStart()
			last[o.Partition] = o.Offset - 1
		}
	})
	var cp Checkpoint
	if len(last) == 0 {
		return cp, nil
	}
	parts := map[string]map[int32]kgo.Offset{topic: want[0]}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumePartitions(parts),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers come back too, so the end is seen even when
		// the last thing below the stable offset is a marker.
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(time.Second),
	}, cfg.Opts...)...)
	if err != nil {
		return fail("connect", err)
	}
	defer cl.Close()
	for len(last) > 0 {
		// A poll that brings nothing in checkpointQuiet means the broker
		// has no committed record beyond what was read: the records below
		// the stable offset that are missing were compacted away.
		pctx, cancel := context.WithTimeout(ctx, checkpointQuiet)
		fetches := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return fail("read it", ctx.Err())
		}
		if fetches.Empty() {
			break
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && ferr == nil {
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
			if r.Attrs.IsControl() || string(r.Key) != key {
				return
			}
			lsn, origin, perr := ParseCheckpoint(r.Value)
			if perr != nil {
				err = perr
				return
			}
			cp = Checkpoint{LSN: lsn, Found: true, Origin: origin, At: r.Timestamp}
		})
		if err != nil {
			return fail("read it", err)
		}
	}
	return cp, nil
}

// checkpointQuiet is how long ReadCheckpoint waits for a fetch that brings
// nothing before it takes the end for reached.
const checkpointQuiet = 5 * time.Second

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
