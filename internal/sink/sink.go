package sink

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
)

// Config is the producer's configuration. Validation of user input happens
// in the command's config; New only rejects what franz-go rejects.
type Config struct {
	Brokers []string
	// Linger is how long a partition's batch waits for more records; a few
	// milliseconds make batches without hurting commit-to-ack latency.
	Linger time.Duration
	// Compression is none, gzip, snappy, lz4 or zstd.
	Compression string
	// MaxRecordBytes bounds one record batch, like the broker's
	// message.max.bytes (default 1 MiB).
	MaxRecordBytes int
	// MaxBufferedRecords must exceed everything the caller keeps in flight,
	// so that Produce never blocks (the caller bounds memory itself).
	MaxBufferedRecords int
	// AutoCreateTopics lets metadata requests create missing topics where the
	// broker allows it (auto.create.topics.enable).
	AutoCreateTopics bool
	// Opts are extra client options (TLS, SASL).
	Opts []kgo.Opt
}

// Sink is an idempotent Kafka producer.
type Sink struct {
	cl *kgo.Client
}

// New creates the producer. It does not contact the broker: see Ping.
func New(cfg Config, log *slog.Logger) (*Sink, error) {
	opts, err := producerOpts(cfg, log)
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(opts, cfg.Opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return &Sink{cl: cl}, nil
}

// producerOpts are the client options of both producers but cfg.Opts.
func producerOpts(cfg Config, log *slog.Logger) ([]kgo.Opt, error) {
	codec, err := codec(cfg.Compression)
	if err != nil {
		return nil, err
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.WithLogger(quietLogger{kslog.New(log.With("component", "kafka"))}),
		// Idempotent writes (franz-go's default) need acks=all; say both so a
		// reader does not have to know the defaults.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// Never give up on a record while the broker is away: a dropped
		// record would be a lost event. Only non-retryable errors reach the
		// ack function.
		kgo.RecordRetries(math.MaxInt),
		kgo.RecordDeliveryTimeout(0),
		kgo.ProducerLinger(cfg.Linger),
		kgo.ProducerBatchCompression(codec),
		// Exactly the Java client's default partitioning of keyed records
		// (murmur2, high bit masked, modulo partitions), so one aggregate's
		// events share a partition with whatever Java producers write.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	}
	if cfg.MaxRecordBytes > 0 {
		opts = append(opts, kgo.ProducerBatchMaxBytes(int32(cfg.MaxRecordBytes)))
	}
	if cfg.MaxBufferedRecords > 0 {
		opts = append(opts, kgo.MaxBufferedRecords(cfg.MaxBufferedRecords))
	}
	if cfg.AutoCreateTopics {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	return opts, nil
}

// KnownCompression reports whether name is a Config.Compression New
// accepts, so that a command can check it before connecting anywhere.
func KnownCompression(name string) bool {
	_, err := codec(name)
	return err == nil
}

func codec(name string) (kgo.CompressionCodec, error) {
	switch strings.ToLower(name) {
	case "", "none":
		return kgo.NoCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("unknown compression %q: use none, gzip, snappy, lz4 or zstd", name)
}

// Produce hands r to the client and returns at once. promise is told the
// record's fate: err is nil once the broker acknowledged it (acks=all), or
// the error that made it fail for good. Promises are called serially, in
// order per partition, from the client's goroutine. Produce never blocks as
// long as the caller keeps fewer than MaxBufferedRecords in flight.
func (s *Sink) Produce(r *kgo.Record, promise func(*kgo.Record, error)) {
	// The context only bounds waiting for buffer space, which the caller's
	// in-flight limit already rules out.
	s.cl.Produce(context.Background(), r, promise)
}

// Flush waits until every record produced so far is acknowledged or failed,
// or ctx ends.
func (s *Sink) Flush(ctx context.Context) error { return s.cl.Flush(ctx) }

// Ping asks a broker for metadata: the one proof that it is reachable and
// serving. It always sends the request: kadm's BrokerMetadata answers from
// the client's cache once it knows the brokers, which would report a broker
// that went silent as up forever.
func (s *Sink) Ping(ctx context.Context) error { return s.cl.Ping(ctx) }

// Close stops the client. Records still buffered fail with
// kgo.ErrClientClosed; callers Flush first to avoid that.
func (s *Sink) Close() { s.cl.Close() }
