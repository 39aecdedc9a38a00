package sink

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A stream's history epochs (checkpoint.Epochs, which encodes them) are
// one record in the checkpoint topic beside its checkpoint, under
// EpochsKey: every epoch so far, so that compaction, which keeps a key's
// last record, keeps them all. It is written outside any Kafka
// transaction, in either delivery, before the first event of a new epoch
// is published, and read at each start with the checkpoint
// (Checkpoint.Epochs): an event is published in the same epoch after any
// restart, so a repeat carries the source its first copy had.

// EpochsKey is the key of the epochs record of the stream whose checkpoint
// key is key. A stream's identity has three parts (system identifier,
// database, slot), so this key is never another stream's checkpoint key.
func EpochsKey(key string) string { return key + "/epochs" }

// WriteEpochs writes value as the epochs record of the stream key and
// waits until every in-sync replica has it: only then may an event of the
// newest epoch be published. The topic is created when missing (in
// at-least-once delivery nothing else creates it).
func WriteEpochs(ctx context.Context, cfg Config, topic, key string, value []byte) error {
	if err := EnsureCheckpointTopic(ctx, cfg, topic); err != nil {
		return err
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.RequiredAcks(kgo.AllISRAcks())}, cfg.Opts...)...)
	if err != nil {
		return &CheckpointError{Topic: topic, Op: "connect", Err: err}
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(EpochsKey(key)), Value: value}).FirstErr(); err != nil {
		return &CheckpointError{Topic: topic, Op: "write the history epochs", Err: err}
	}
	return nil
}
