package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/republish"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

// lostEventsConfig is everything `cdc-outbox lost-events` is told: the
// table and mapping as run and republish have them, the stream (its slot
// and checkpoint topic) whose history epochs name the lost history, and
// the topics to read.
type lostEventsConfig struct {
	runConfig
	Topics  string
	Epoch   int
	Since   string
	Timeout time.Duration
}

func lostEventsFlags(c *lostEventsConfig) *flags {
	f := newFlags("cdc-outbox lost-events", "List the events Kafka holds of a history the database lost: after a failover past what the standby had received\n"+
		"(no synchronized_standby_slots) or a restore, cdc-outbox records a history epoch (see docs/guarantees.md); the events it had\n"+
		"published of the WAL the server no longer has stay in Kafka, their transactions gone from the database. This reads the\n"+
		"topics and the outbox table and prints, one JSON object a line on stdout, each record of the lost history's source whose\n"+
		"event the table does not hold as it is: no row with its id, or a row with its id that maps to another record (its id given\n"+
		"to a new event). Those are the events to reconcile. Records are read in the --record-format the stream wrote. Only records\n"+
		"past the history the table and Kafka share are listed: in each partition, those after the first copy of the newest event the\n"+
		"table still holds as it is (see docs/operating.md). Read-only; the table and the topics are read in full.")
	rc := &c.runConfig
	f.String(&rc.PostgresURL, "postgres-url", "", "PostgreSQL connection `url` or key=value string; PG* environment variables fill what it leaves out; the role needs SELECT on the table")
	f.String(&rc.Table, "table", contract.DefaultTable, tableHelp)
	f.String(&rc.Slot, "slot", "cdc_outbox", "`name` of the replication slot of the stream whose lost history to list")
	f.String(&rc.CheckpointTopic, "checkpoint-topic", "cdc_outbox.checkpoints", "compacted `topic` holding the stream's history epochs (run's --checkpoint-topic)")
	f.String(&c.Topics, "topics", "", "the `topics` to read, comma-separated: every topic the outbox's events go to (--topic's template, resolved)")
	f.Int(&c.Epoch, "epoch", 0, "the history `epoch` whose lost history to list (the number its sources end with); 0: the newest")
	f.String(&c.Since, "since", "", "list no record whose timestamp (the row's created_at) is before this `time` (RFC 3339, or as PostgreSQL prints it; no offset means UTC): "+
		"your own bound, for a partition where the table holds no event from before the lost history (rows deleted as they are written); "+
		"give the failover's time less your longest transaction")
	f.Duration(&c.Timeout, "timeout", 10*time.Minute, "give up after this long")
	kafkaFlags(f, rc)
	mappingFlags(f, rc)
	logFlags(f, rc)
	return f
}

func (c *lostEventsConfig) validate() error {
	var p problems
	p.table(c.PostgresURL, c.Table)
	c.MaxInflightEvents = 1 // not a flag here: nothing is produced
	c.validateOutput(&p)
	p.check(len(c.topics()) > 0, "--topics is empty: give the topics the outbox's events go to, comma-separated")
	p.check(c.Epoch >= 0, "--epoch %d: give an epoch's number, or 0 for the newest", c.Epoch)
	p.check(c.CheckpointTopic != "", "--checkpoint-topic is empty: give the topic run keeps the history epochs in")
	p.check(c.Timeout > 0, "--timeout %s: must be positive", c.Timeout)
	_, err := parseTime(c.Since)
	p.check(err == nil, "--since %q: %v", c.Since, err)
	return errors.Join(p...)
}

func (c *lostEventsConfig) topics() []string {
	var out []string
	for _, t := range strings.Split(c.Topics, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// lostEvent is one line of the output.
type lostEvent struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	ID        string `json:"id"`
	Source    string `json:"source"`
	Key       string `json:"key"`
	EventType string `json:"event_type"`
	Timestamp string `json:"timestamp"`
	Why       string `json:"why"`
	// Unbounded: the table holds no event of this record's partition from
	// before the lost history, so the record may be one of those whose
	// row was deleted since.
	Unbounded bool `json:"unbounded,omitempty"`
}

func lostEventsCommand(args []string, stdout, stderr io.Writer) int {
	var c lostEventsConfig
	f := lostEventsFlags(&c)
	if code, ok := f.load(args, c.validate, stdout, stderr); !ok {
		return code
	}
	kafkaOpts, log, ok := kafkaCommand("lost-events", &c.runConfig, stderr)
	if !ok {
		return 2
	}
	ctx, stop := signalContext(log)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	if err := listLostEvents(ctx, &c, kafkaOpts, stdout, log); err != nil {
		log.Error("cannot list the lost events", "error", say(err))
		return 1
	}
	return 0
}

// listLostEvents reads the epoch, then the records of its lost source, then
// the table's rows of their ids, and prints the records no row matches.
func listLostEvents(ctx context.Context, c *lostEventsConfig, kafkaOpts []kgo.Opt, stdout io.Writer, log *slog.Logger) error {
	base, err := resolveSource(ctx, &c.runConfig)
	if err != nil {
		return err
	}
	admin := sink.Config{Brokers: c.brokers(), Opts: kafkaOpts}
	e, err := lostEpoch(ctx, c, admin)
	if err != nil {
		return err
	}
	lostSource := checkpoint.Source(base, e.LostEpoch)
	log.Info("listing the lost history's events", "epoch", e.String(), "lost_source", lostSource, "topics", c.topics())

	records, err := readSourceRecords(ctx, admin, c.topics(), lostSource)
	if err != nil {
		return err
	}
	if err := sameFormat(records, c.Mapping.Format); err != nil {
		return err
	}
	rows, err := mapRows(ctx, c, lostSource, records)
	if err != nil {
		return err
	}
	since, _ := parseTime(c.Since)
	found := judgeLost(records, rows, since)
	enc := json.NewEncoder(stdout)
	for _, l := range found.lost {
		r := l.record
		if err := enc.Encode(lostEvent{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, ID: r.ID, Source: lostSource, Key: r.Key,
			EventType: r.EventType, Timestamp: r.Timestamp.UTC().Format(time.RFC3339Nano), Why: l.why, Unbounded: l.unbounded}); err != nil {
			return err
		}
	}
	attrs := []any{"lost", len(found.lost), "records_of_the_lost_source", len(records), "rows_compared", len(rows),
		"shared_history_records", found.shared, "before_since", found.beforeSince,
		"lost_timeline", e.LostTimeline, "lost_from_lsn", e.LostFrom, "lost_to_lsn", e.LostTo}
	log.Info("listed the lost history's events", attrs...)
	if found.unbounded > 0 {
		log.Warn("some records listed lie in partitions where the table holds no event from before the lost history, so nothing bounds them: "+
			"events committed before it whose rows were deleted since (cleaned, or deleted as they were written) are listed too, marked unbounded. "+
			"Give --since the failover's time less your longest transaction to leave out older records",
			"unbounded", found.unbounded, "partitions", strings.Join(found.unboundedParts, ", "))
	}
	return nil
}

// sameFormat checks that the records were written in the record format
// the rows are mapped in: a row of the same event mapped in another format
// would never match its record, and every record would pass for lost.
func sameFormat(records []sourceRecord, f mapping.Format) error {
	for _, r := range records {
		if r.Format != f {
			return fmt.Errorf("record %s/%d@%d (event id %s) is %s, but --record-format is %s: give --record-format %s, the format the stream wrote (run's)",
				r.Topic, r.Partition, r.Offset, r.ID, r.Format, f, r.Format)
		}
	}
	return nil
}

// lostRecord is a record judged lost, and why.
type lostRecord struct {
	record    sourceRecord
	why       string
	unbounded bool
}

// lostVerdict is what judgeLost found.
type lostVerdict struct {
	lost                []lostRecord
	shared, beforeSince int // records left out: of the shared history; older than since
	unbounded           int // records listed with no bound
	unboundedParts      []string
}

// judgeLost says which records of the lost source are lost events: those
// whose event the table does not hold as it is, past the history the table
// and Kafka share.
//
// The records carry no LSN. What they prove is order: the stream hands
// transactions to Kafka in commit order, and a partition keeps the order
// its records were produced in, so in a partition the first copy of an
// event committed earlier lies before the first copy of one committed
// later (a repeat after a restart lies later, which is why only first
// copies count). A record whose event the table holds as it is belongs to
// the history the server shares with Kafka: committed before the lost
// range, as was every record before its first copy in its partition. Those
// are left out: a row deleted since (a table cleaned as docs/records.md
// recommends) is no lost event. Past that bound, a record with no row of
// its id, or whose row is another event, is lost. A partition with no
// such shared event has no bound: its records are listed, marked
// unbounded, unless their timestamp is before since (the operator's own
// bound; zero for none).
func judgeLost(records []sourceRecord, rows map[string][sha256.Size]byte, since time.Time) lostVerdict {
	type part struct {
		topic string
		p     int32
	}
	type event struct {
		id  string
		sum [sha256.Size]byte
	}
	// first is each event's first copy's offset, per partition; bound the
	// newest first copy of a shared event (-1: none).
	first := map[part]map[event]int64{}
	bound := map[part]int64{}
	for _, r := range records {
		k := part{r.Topic, r.Partition}
		if first[k] == nil {
			first[k], bound[k] = map[event]int64{}, -1
		}
		ev := event{r.ID, r.sum}
		if o, ok := first[k][ev]; !ok || r.Offset < o {
			first[k][ev] = r.Offset
		}
	}
	for k, evs := range first {
		for ev, o := range evs {
			if row, ok := rows[ev.id]; ok && row == ev.sum && o > bound[k] {
				bound[k] = o
			}
		}
	}
	var v lostVerdict
	unboundedParts := map[part]bool{}
	for _, r := range records {
		k := part{r.Topic, r.Partition}
		if r.Offset <= bound[k] {
			v.shared++
			continue
		}
		why := ""
		switch row, ok := rows[r.ID]; {
		case !ok:
			why = "no row of the table has this id: its transaction is not on the server (or it was written as an outbox message, which has no row)"
		case row != r.sum:
			why = "the table's row with this id is another event: the id was given again after the fork"
		default:
			continue // an event of the history both share (a repeat, past the bound)
		}
		if !since.IsZero() && r.Timestamp.Before(since) {
			v.beforeSince++
			continue
		}
		l := lostRecord{record: r, why: why, unbounded: bound[k] < 0}
		if l.unbounded {
			v.unbounded++
			if !unboundedParts[k] {
				unboundedParts[k] = true
				v.unboundedParts = append(v.unboundedParts, fmt.Sprintf("%s/%d", r.Topic, r.Partition))
			}
		}
		v.lost = append(v.lost, l)
	}
	return v
}

// lostEpoch is the epoch --epoch names, or the newest.
func lostEpoch(ctx context.Context, c *lostEventsConfig, admin sink.Config) (checkpoint.Epoch, error) {
	stream, err := replication.StreamIdentity(ctx, c.PostgresURL, c.Slot)
	if err != nil {
		return checkpoint.Epoch{}, fmt.Errorf("read the stream's identity: %w", err)
	}
	cp, err := sink.ReadCheckpoint(ctx, admin, c.CheckpointTopic, stream, stream)
	if err != nil {
		return checkpoint.Epoch{}, fmt.Errorf("read the stream's history epochs: %w", err)
	}
	es, err := checkpoint.DecodeEpochs(cp.Epochs)
	if err != nil {
		return checkpoint.Epoch{}, err
	}
	if len(es) == 0 {
		return checkpoint.Epoch{}, fmt.Errorf("stream %s has no history epoch in %s: no lost history was recorded (check --slot and --checkpoint-topic)", stream, c.CheckpointTopic)
	}
	if c.Epoch == 0 {
		return es[len(es)-1], nil
	}
	for _, e := range es {
		if e.N == c.Epoch {
			return e, nil
		}
	}
	return checkpoint.Epoch{}, fmt.Errorf("stream %s has no history epoch %d; it has %d (the newest is %d)", stream, c.Epoch, len(es), es[len(es)-1].N)
}

// sourceRecord is a record of the lost source, with a digest of what makes
// it the event it is: key, value and event type.
type sourceRecord struct {
	Topic     string
	Partition int32
	Offset    int64
	ID        string
	Key       string
	EventType string
	Format    mapping.Format
	Timestamp time.Time
	sum       [sha256.Size]byte
}

// digest is what two records of one event share, whichever copy: key,
// value and event type (the traceparent and the timestamp may differ),
// the event type as the record's format carries it.
func digest(r *kgo.Record, eventType string) [sha256.Size]byte {
	h := sha256.New()
	for _, b := range [][]byte{r.Key, r.Value, []byte(eventType)} {
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// readSourceRecords reads each topic to its last stable offset, as a
// read_committed consumer does (an aborted transaction's records are no
// events), and keeps the records whose source is source, in whichever
// record format the mapping wrote them (mapping.ReadRecordEvent).
func readSourceRecords(ctx context.Context, cfg sink.Config, topics []string, source string) ([]sourceRecord, error) {
	admCl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.Opts...)...)
	if err != nil {
		return nil, err
	}
	defer admCl.Close()
	ends, err := kadm.NewClient(admCl).ListCommittedOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list the end offsets of %s: %w", strings.Join(topics, ", "), err)
	}
	parts := map[string]map[int32]kgo.Offset{}
	left := map[string]map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset <= 0 {
			return
		}
		if parts[o.Topic] == nil {
			parts[o.Topic], left[o.Topic] = map[int32]kgo.Offset{}, map[int32]int64{}
		}
		parts[o.Topic][o.Partition] = kgo.NewOffset().AtStart()
		left[o.Topic][o.Partition] = o.Offset
	})
	var out []sourceRecord
	if len(parts) == 0 {
		return out, nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ConsumePartitions(parts),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords()}, cfg.Opts...)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	for len(left) > 0 {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("reading the topics to their end: %w", ctx.Err())
		}
		if err := fetches.Err0(); err != nil {
			return nil, err
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if end, ok := left[r.Topic][r.Partition]; ok && r.Offset >= end-1 {
				delete(left[r.Topic], r.Partition)
				if len(left[r.Topic]) == 0 {
					delete(left, r.Topic)
				}
			}
			if r.Attrs.IsControl() {
				return
			}
			ev, ok := mapping.ReadRecordEvent(r)
			if !ok || ev.Source != source {
				return
			}
			out = append(out, sourceRecord{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, ID: ev.ID,
				Key: string(r.Key), EventType: ev.Type, Format: ev.Format, Timestamp: r.Timestamp, sum: digest(r, ev.Type)})
		})
	}
	return out, nil
}

// mapRows maps the table's rows with the records' ids, as republish would
// send them under source, and returns each one's digest by id. Integer ids
// are read in the range the records span; others, the whole table.
func mapRows(ctx context.Context, c *lostEventsConfig, source string, records []sourceRecord) (map[string][sha256.Size]byte, error) {
	want := map[string]bool{}
	var low, high *big.Int
	ranged := true
	for _, r := range records {
		want[r.ID] = true
		n, ok := new(big.Int).SetString(r.ID, 10)
		if !ok {
			ranged = false
			continue
		}
		if low == nil || n.Cmp(low) < 0 {
			low = n
		}
		if high == nil || n.Cmp(high) > 0 {
			high = n
		}
	}
	rows := map[string][sha256.Size]byte{}
	if len(want) == 0 {
		return rows, nil
	}
	var sel republish.Selection
	if ranged {
		sel = republish.Selection{AfterID: new(big.Int).Sub(low, big.NewInt(1)).String(), UntilID: high.String()}
	}
	m := c.Mapping
	m.Source = source
	capture := &digests{want: want, rows: rows, deadLetter: c.DeadLetterTopic}
	r, err := republish.New(republish.Config{
		URL: c.PostgresURL, Table: outboxTable(c.Table), Mapping: m, OnBadEvent: c.OnBadEvent, DeadLetterTopic: c.DeadLetterTopic,
		MaxRecordBytes: c.MaxRecordBytes, Select: sel, BatchSize: 1000, MaxInflight: 1000, Explain: explain,
	}, capture)
	if err != nil {
		return nil, err
	}
	if _, err := r.Run(ctx, ctx); err != nil {
		return nil, fmt.Errorf("read the table's rows: %w", err)
	}
	return rows, nil
}

// digests is the republisher's producer here: it keeps each wanted row's
// digest and answers every record at once, producing nothing. A row that
// is a bad event under dead-letter comes as its dead-letter record: no
// row.
type digests struct {
	want       map[string]bool
	rows       map[string][sha256.Size]byte
	deadLetter string
}

func (d *digests) Produce(r *kgo.Record, promise func(*kgo.Record, error)) {
	if ev, ok := mapping.ReadRecordEvent(r); ok && d.want[ev.ID] && r.Topic != d.deadLetter {
		d.rows[ev.ID] = digest(r, ev.Type)
	}
	promise(r, nil)
}

func (d *digests) Flush(context.Context) error { return nil }
