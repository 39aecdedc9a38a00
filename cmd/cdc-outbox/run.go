package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
)

func runCommand(args []string, stdout, stderr io.Writer) int {
	var c runConfig
	f := runFlags(&c)
	if err := f.parse(args, stdout); err != nil {
		if errors.Is(err, errHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "cdc-outbox run: %v\n", err)
		return 2
	}
	if err := c.validate(); err != nil {
		fmt.Fprintf(stderr, "cdc-outbox run: invalid configuration:\n%v\n", err)
		return 2
	}
	log := newLogger(stderr, c.LogFormat, c.LogLevel)
	ctx, stop := signalContext(log)
	defer stop()
	if err := run(ctx, &c, log); err != nil {
		log.Error("stopped with an error", "error", redact(err))
		return 1
	}
	return 0
}

// run wires the data path: replication → pipeline (decoder, mapping) →
// sink, with the checkpoint deciding what the replication side confirms.
func run(ctx context.Context, c *runConfig, log *slog.Logger) error {
	schema, table := replication.SplitTable(c.Table)
	setupCtx, cancel := context.WithTimeout(ctx, time.Minute)
	start, err := replication.Prepare(setupCtx, c.PostgresURL, replication.Setup{
		Table:             c.Table,
		Publication:       c.Publication,
		Slot:              c.Slot,
		CreatePublication: c.CreatePublication,
		CreateSlot:        c.CreateSlot,
	}, log)
	cancel()
	if err != nil {
		return err
	}

	ckpt := checkpoint.New(start)
	pipe, err := pipeline.New(pipeline.Config{
		Schema:            schema,
		Table:             table,
		Mapping:           c.Mapping,
		OnBadEvent:        c.OnBadEvent,
		DeadLetterTopic:   c.DeadLetterTopic,
		MaxInflightEvents: c.MaxInflightEvents,
		MaxInflightBytes:  int64(c.MaxInflightBytes),
		MaxRecordBytes:    c.MaxRecordBytes,
	}, ckpt, log)
	if err != nil {
		return err
	}
	snk, err := sink.New(sink.Config{
		Brokers:     c.brokers(),
		Linger:      c.KafkaLinger,
		Compression: c.KafkaCompression,
		// Room for everything in flight plus dead-letter records, so
		// Produce never blocks the replication loop.
		MaxBufferedRecords: 2*c.MaxInflightEvents + 1000,
		MaxRecordBytes:     c.MaxRecordBytes,
		AutoCreateTopics:   c.KafkaAutoCreateTopics,
	}, log, pipe.Ack)
	if err != nil {
		return err
	}
	defer snk.Close()
	pipe.SetSink(snk)

	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := snk.Ping(pingCtx); err != nil {
		// Not fatal: events wait in flight (and nothing is confirmed) until
		// the broker is back.
		log.Warn("Kafka is not reachable yet; events will wait until it is", "brokers", c.KafkaBrokers, "error", err)
	}
	cancel()

	stream := replication.New(replication.Config{
		URL:               c.PostgresURL,
		Slot:              c.Slot,
		Publication:       c.Publication,
		StatusInterval:    c.StatusInterval,
		KeepaliveInterval: c.KeepaliveInterval,
		ShutdownTimeout:   c.ShutdownTimeout,
	}, pipe, ckpt, log)
	log.Info("starting", "slot", c.Slot, "start_lsn", start, "table", c.Table, "brokers", c.KafkaBrokers)
	return stream.Run(ctx)
}
