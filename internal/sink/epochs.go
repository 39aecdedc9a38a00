package sink

import (
	"context"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Beside its checkpoint, a stream keeps two records of its own in the
// checkpoint topic, written outside any Kafka transaction, in either
// delivery:
//
//   - EpochsKey: its history epochs (checkpoint.Epochs, which encodes
//     them), every epoch so far, so that compaction, which keeps a key's
//     last record, keeps them all. Written before the first event of a new
//     epoch is published, read at each start (Checkpoint.Epochs): an event
//     is published in the same epoch after any restart, so a repeat
//     carries the source its first copy had.
//   - PublishedKey: in at-least-once delivery, how far it handed
//     transactions to Kafka (checkpoint.Published), so that a start on a
//     promoted standby can tell that Kafka holds events past the fork
//     (Checkpoint.Published).

// EpochsKey is the key of the epochs record of the stream whose checkpoint
// key is key. A stream's identity has three parts (system identifier,
// database, slot), so this key is never another stream's checkpoint key.
func EpochsKey(key string) string { return key + "/epochs" }

// PublishedKey is the key of the published record of the stream key.
func PublishedKey(key string) string { return key + "/published" }

// StreamRecords writes a stream's own records to the checkpoint topic, each
// acknowledged by every in-sync replica before Write returns. The topic is
// created at the first write when missing (in at-least-once delivery
// nothing else creates it).
type StreamRecords struct {
	cfg     Config
	topic   string
	cl      *kgo.Client
	mu      sync.Mutex
	ensured bool
}

// NewStreamRecords makes the writer; it connects at the first write.
func NewStreamRecords(cfg Config, topic string) (*StreamRecords, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.RequiredAcks(kgo.AllISRAcks())}, cfg.Opts...)...)
	if err != nil {
		return nil, &CheckpointError{Topic: topic, Op: "connect", Err: err}
	}
	return &StreamRecords{cfg: cfg, topic: topic, cl: cl}, nil
}

// Write writes value under key and waits for the broker's acknowledgement.
func (s *StreamRecords) Write(ctx context.Context, key string, value []byte) error {
	s.mu.Lock()
	ensured := s.ensured
	s.mu.Unlock()
	if !ensured {
		if err := EnsureCheckpointTopic(ctx, s.cfg, s.topic); err != nil {
			return err
		}
		s.mu.Lock()
		s.ensured = true
		s.mu.Unlock()
	}
	if err := s.cl.ProduceSync(ctx, &kgo.Record{Topic: s.topic, Key: []byte(key), Value: value}).FirstErr(); err != nil {
		return &CheckpointError{Topic: s.topic, Op: "write " + key, Err: err}
	}
	return nil
}

// Close closes the writer's client.
func (s *StreamRecords) Close() { s.cl.Close() }
