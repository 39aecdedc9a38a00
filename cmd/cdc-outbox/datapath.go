package main

import (
	"slices"
	"strings"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/metrics"
	"github.com/cdc-outbox/cdc-outbox/internal/relay"
)

// dataPath is what metrics and readiness read at scrape time: the parts of
// the stream's shards (one for a stream that is not split).
type dataPath struct {
	shards *relay.Shards
	relays []*relay.Relay
	parts  []relay.Parts
}

func newDataPath(sh *relay.Shards) *dataPath {
	dp := &dataPath{shards: sh, relays: sh.Relays()}
	for _, r := range dp.relays {
		dp.parts = append(dp.parts, r.Parts())
	}
	return dp
}

func (dp *dataPath) sum(fn func(relay.Parts) float64) float64 {
	var n float64
	for _, p := range dp.parts {
		n += fn(p)
	}
	return n
}

// confirmed is the worst shard's confirmed position: every shard's slot
// is at or past it.
func (dp *dataPath) confirmed() uint64 {
	lsn := uint64(dp.parts[0].Checkpoint.Confirmed())
	for _, p := range dp.parts[1:] {
		lsn = min(lsn, uint64(p.Checkpoint.Confirmed()))
	}
	return lsn
}

// received is the furthest any shard has read: every shard's slot reads
// the whole WAL, so the replication lag (received - confirmed) is at least
// the worst shard's.
func (dp *dataPath) received() uint64 {
	var lsn uint64
	for _, p := range dp.parts {
		lsn = max(lsn, uint64(p.Stream.Received()))
	}
	return lsn
}

// checkpoint is the lowest Kafka checkpoint of the shards (exactly-once).
func (dp *dataPath) checkpoint() uint64 {
	lsn := uint64(dp.relays[0].KafkaCheckpoint())
	for _, r := range dp.relays[1:] {
		lsn = min(lsn, uint64(r.KafkaCheckpoint()))
	}
	return lsn
}

func (dp *dataPath) epoch() uint64 {
	var e uint64
	for _, p := range dp.parts {
		e = max(e, uint64(p.Pipeline.Epoch()))
	}
	return e
}

// oldest is the commit time of the oldest transaction not yet confirmed
// in any shard.
func (dp *dataPath) oldest() (time.Time, bool) {
	var oldest time.Time
	found := false
	for _, p := range dp.parts {
		if t, ok := p.Checkpoint.Oldest(); ok && (!found || t.Before(oldest)) {
			oldest, found = t, true
		}
	}
	return oldest, found
}

// outboxes are the outbox tables' counts, summed over the shards (each
// streams its share of every table).
func (dp *dataPath) outboxes() []metrics.Outbox {
	var out []metrics.Outbox
	at := map[string]int{}
	for _, p := range dp.parts {
		for _, o := range p.Pipeline.Outboxes() {
			i, ok := at[o.Table]
			if !ok {
				at[o.Table] = len(out)
				out = append(out, metrics.Outbox{Name: o.Table})
				i = len(out) - 1
			}
			m := &out[i]
			m.Events += o.Events
			m.Failed += o.Bad["failed"]
			m.DeadLettered += o.Bad["dead_lettered"]
			if o.Last.After(m.Last) {
				m.Last = o.Last
			}
		}
	}
	return out
}

// connected: every shard streams from its slot.
func (dp *dataPath) connected() bool {
	return !slices.ContainsFunc(dp.parts, func(p relay.Parts) bool { return !p.Stream.Connected() })
}

// standby: another process holds the shards (or the one slot), and this
// one waits to take over.
func (dp *dataPath) standby() bool {
	return dp.shards.Waiting() || slices.ContainsFunc(dp.parts, func(p relay.Parts) bool { return p.Stream.Standby() })
}

func (dp *dataPath) published() bool {
	return !slices.ContainsFunc(dp.parts, func(p relay.Parts) bool { return !p.Monitor.Published() })
}

// kafka is up when every shard's producer reaches the brokers; err is the
// first last failure.
func (dp *dataPath) kafka() (bool, error) {
	for _, p := range dp.parts {
		if up, err := p.Kafka.State(); !up {
			return false, err
		}
	}
	return true, nil
}

func (dp *dataPath) slots() string {
	var names []string
	for _, r := range dp.relays {
		names = append(names, r.Slot())
	}
	return strings.Join(names, ", ")
}

func (dp *dataPath) publications() string {
	var names []string
	for _, r := range dp.relays {
		names = append(names, r.Publication())
	}
	return strings.Join(names, ", ")
}
