package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// The three readers of a backlog.
const (
	readerRecvlogical = "pg_recvlogical"
	readerGo          = "Go reader"
	readerStreamer    = "streamer"
	// readerStreamerEO is the streamer in exactly-once delivery, measured
	// in the same run as the default at-least-once.
	readerStreamerEO = "streamer, exactly-once"
)

// exactlyOnceFlags are the flags of the exactly-once streamer runs; the
// defaults of everything else, --transaction-interval included.
var exactlyOnceFlags = []string{"--delivery", "exactly-once"}

// readerRun is one reader's pass over a backlog.
type readerRun struct {
	name         string
	wall         time.Duration
	events       int           // events it saw (pg_recvlogical: not counted, taken as the backlog)
	cpu          time.Duration // the reader process's own CPU time
	walsenderCPU time.Duration // the walsender serving it (0: not measured)
	rssMiB       float64       // peak RSS (streamer only)
}

func (r readerRun) rate() float64 {
	if r.wall <= 0 {
		return 0
	}
	return float64(r.events) / r.wall.Seconds()
}

// drainResult is one backlog workload read three times.
type drainResult struct {
	perTx     int
	events    int
	writeTime time.Duration
	walBytes  uint64
	readers   []readerRun // in the order they ran
}

func (d drainResult) name() string {
	if d.perTx == 1 {
		return "drain, 1 event/tx"
	}
	return fmt.Sprintf("drain, %d events/tx", d.perTx)
}

func (d drainResult) reader(name string) (readerRun, bool) {
	for _, r := range d.readers {
		if r.name == name {
			return r, true
		}
	}
	return readerRun{}, false
}

// limit is the faster reference: what the server can hand out.
func (d drainResult) limit() float64 {
	var l float64
	for _, n := range []string{readerRecvlogical, readerGo} {
		if r, ok := d.reader(n); ok {
			l = max(l, r.rate())
		}
	}
	return l
}

// drain writes one backlog and measures its readers in the given order.
// The three slots are created first, one after the other with nothing
// written in between, so each reader finds the same backlog in its slot.
func (b *bench) drain(ctx context.Context, recvlogical string, n, perTx int, order []string) (drainResult, error) {
	d := drainResult{perTx: perTx, events: n}
	tag := fmt.Sprintf("d%d", perTx)
	aggType := "drain" + fmt.Sprint(perTx)
	progress("%s: %d events; creating slots and topic", d.name(), n)
	// A fresh table for each backlog (inserts only are published, so the
	// TRUNCATE is not streamed): the backlog's write speed does not depend
	// on what the previous one left.
	if _, err := b.pool.Exec(ctx, "TRUNCATE outbox"); err != nil {
		return d, err
	}
	if err := b.createTopic(ctx, aggType); err != nil {
		return d, err
	}
	defer b.deleteTopic(context.Background(), aggType)
	slots := map[string]string{
		readerRecvlogical: b.slot(tag + "_recvlogical"),
		readerGo:          b.slot(tag + "_goreader"),
		readerStreamer:    b.slot(tag + "_streamer"),
		readerStreamerEO:  b.slot(tag + "_streamer_eo"),
	}
	for _, r := range []string{readerStreamer, readerStreamerEO, readerRecvlogical, readerGo} {
		if err := b.createSlot(ctx, slots[r]); err != nil {
			return d, fmt.Errorf("create slot: %w", err)
		}
		defer func() { _ = b.dropSlot(context.Background(), slots[r]) }()
	}

	startLSN, err := currentLSN(ctx, b.pool)
	if err != nil {
		return d, err
	}
	progress("%s: writing the backlog (server-side procedure, synchronous_commit off)", d.name())
	t0 := time.Now()
	stop := heartbeat("writing the backlog")
	err = writeBacklog(ctx, b.dbURL, n, perTx, aggType)
	stop()
	if err != nil {
		return d, fmt.Errorf("write backlog: %w", err)
	}
	d.writeTime = time.Since(t0)
	end, err := currentLSN(ctx, b.pool)
	if err != nil {
		return d, err
	}
	d.walBytes = uint64(end - startLSN)
	progress("%s: backlog written in %.1fs (%.0f events/s), %.0f MiB of WAL, end LSN %s",
		d.name(), d.writeTime.Seconds(), float64(n)/d.writeTime.Seconds(), float64(d.walBytes)/(1<<20), end)

	for _, name := range order {
		progress("%s: %s reading the backlog", d.name(), name)
		var r readerRun
		var err error
		switch name {
		case readerRecvlogical:
			r, err = b.drainRecvlogical(ctx, recvlogical, slots[name], n, end)
		case readerGo:
			r, err = b.drainGoReader(ctx, slots[name], n, end)
		case readerStreamer:
			r, err = b.drainStreamer(ctx, slots[name], n, drainResult{perTx: perTx}.name())
		case readerStreamerEO:
			r, err = b.drainStreamer(ctx, slots[name], n, "", exactlyOnceFlags...)
		}
		if err != nil {
			return d, fmt.Errorf("%s: %w", name, err)
		}
		d.readers = append(d.readers, r)
		progress("%s: %s done in %.2fs: %.0f events/s (its CPU %.1fs, walsender CPU %s)",
			d.name(), name, r.wall.Seconds(), r.rate(), r.cpu.Seconds(), secondsOrNA(r.walsenderCPU))
	}
	return d, nil
}

func (b *bench) drainRecvlogical(ctx context.Context, bin, slot string, n int, end pglogrepl.LSN) (readerRun, error) {
	ws := sampleWalsender(ctx, b.pool, slot)
	stop := heartbeat(readerRecvlogical)
	wall, cpu, err := runRecvlogical(ctx, bin, b.dbURL, slot, publication, end)
	stop()
	wcpu, _ := ws.stop()
	return readerRun{name: readerRecvlogical, wall: wall, events: n, cpu: cpu, walsenderCPU: wcpu}, err
}

func (b *bench) drainGoReader(ctx context.Context, slot string, n int, end pglogrepl.LSN) (readerRun, error) {
	ws := sampleWalsender(ctx, b.pool, slot)
	cpu0 := selfCPU()
	t0 := time.Now()
	stop := heartbeat(readerGo)
	got, err := readBacklog(ctx, b.dbURL, slot, publication, end)
	wall := time.Since(t0)
	stop()
	cpu := selfCPU() - cpu0
	wcpu, _ := ws.stop()
	if err == nil && got != n {
		err = fmt.Errorf("received %d inserts before the end LSN, expected %d", got, n)
	}
	return readerRun{name: readerGo, wall: wall, events: got, cpu: cpu, walsenderCPU: wcpu}, err
}

// drainStreamer times the streamer from process start until its metrics
// say Kafka acknowledged the whole backlog. Scraping every 100 ms bounds the
// timing error to about that.
// drainStreamer measures the streamer, started with extra flags, on the
// backlog of slot; phase names its CPU profile ("" takes none: the
// exactly-once runs are not profiled).
func (b *bench) drainStreamer(ctx context.Context, slot string, n int, phase string, extra ...string) (readerRun, error) {
	r := readerRun{name: readerStreamer}
	if len(extra) > 0 {
		r.name = readerStreamerEO
	}
	ws := sampleWalsender(ctx, b.pool, slot)
	defer ws.stop()
	s, err := b.startStreamer(slot, extra...)
	if err != nil {
		return r, err
	}
	defer func() { _ = b.stopStreamer(s, 60*time.Second) }()
	if phase != "" {
		// Profile the first seconds of the drain, while the backlog is large.
		profiled := b.cpuProfile(ctx, s, phase, 10*time.Second)
		defer profiled()
	}
	ms, wall, err := s.waitDrained(ctx, n, 5*time.Second)
	if err != nil {
		return r, err
	}
	r.wall, r.events = wall, int(ms.sum("cdc_outbox_events_total"))
	u, err := readUsage(s.pid())
	if err != nil {
		return r, err
	}
	r.cpu, r.rssMiB = u.cpu, mib(u.hwmKiB)
	r.walsenderCPU, _ = ws.stop()
	return r, b.stopStreamer(s, 60*time.Second)
}

func secondsOrNA(d time.Duration) string {
	if d <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}
