package pipeline

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
)

// Lineage keeps the stream's history epochs (checkpoint.Epoch) where every
// later start reads them: Begin records the epoch of a history found lost
// (adding it, or finding it recorded already) and returns every epoch. It
// returns only once the record is durable: events of the new epoch are
// published after it. An error stops the stream, which then publishes
// nothing of the new history under the lost history's source.
type Lineage interface {
	Begin(e checkpoint.Epoch) (checkpoint.Epochs, error)
}

// SetEpochs sets the stream's history epochs, read at start: each
// transaction's events carry the source of the epoch its commit belongs
// to. Call it from the replication goroutine, before the first message.
//
// Until the first transaction, Epoch is the epoch of the stream's
// position, the one every transaction from there on is in at least: the
// published record written before it (lineage) must not name an older
// epoch, or a later restore that loses this one is taken for the restore
// an older epoch stands for already, and no new epoch begins.
func (p *Pipeline) SetEpochs(es checkpoint.Epochs) {
	p.epochs = es
	if p.tx == nil {
		if n := es.At(p.ckpt.Confirmed()); int64(n) > p.epochNow.Load() {
			p.epochNow.Store(int64(n))
		}
	}
}

// Epoch is the history epoch of the transactions the stream hands on now
// (0: the first history).
func (p *Pipeline) Epoch() int { return int(p.epochNow.Load()) }

// epochBegin puts the transaction whose commit record starts at final in
// its epoch, switching every mapper's source when it is another than the
// last transaction's.
func (p *Pipeline) epochBegin(final pglogrepl.LSN) error {
	n := p.epochs.At(final)
	if n == p.epoch {
		return nil
	}
	if err := p.reg.setEpoch(n); err != nil {
		return err
	}
	msg := p.msgCfg
	msg.Source = checkpoint.Source(msg.Source, n)
	m, err := mapping.New(msg)
	if err != nil {
		return fmt.Errorf("the messages' source in history epoch %d: %w", n, err)
	}
	p.mapper, p.epoch = m, n
	p.epochNow.Store(int64(n))
	p.log.Warn("history epoch: the events of transactions committed from here on carry their outbox's source with the epoch's number, "+
		"so that none shares its source and id with an event of a lost history",
		"epoch", n, "first_commit_lsn", final, "example_source", string(m.Source()))
	return nil
}

// lostHere records, once a Kafka checkpoint is refuted (verify.go), that
// the events Kafka holds up to it are of a history the server does not
// have: what the stream publishes from where it started is a new epoch.
// Where the two histories part is not known, so the epoch begins at 0
// (every commit streamed from here on): the transactions of the shared
// part are repeated under the new source, which a consumer processes
// again, while none of the server's new events is taken for a lost one.
func (p *Pipeline) lostHere(m checkpoint.Mark) error {
	if p.cfg.Lineage == nil {
		return nil
	}
	es, err := p.cfg.Lineage.Begin(checkpoint.Epoch{LostEpoch: m.Epoch, LostTimeline: m.Timeline, LostTo: m.End, At: time.Now()})
	if err != nil {
		return err
	}
	p.epochs = es
	return nil
}

// setEpoch rebuilds every outbox's mapper with its source of epoch n; an
// outbox found later is built in it.
func (r *registry) setEpoch(n int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.epoch = n
	for _, ob := range r.byTable {
		cfg := ob.cfg
		cfg.Source = checkpoint.Source(ob.base, n)
		m, err := mapping.New(cfg)
		if err != nil {
			return fmt.Errorf("outbox table %s in history epoch %d: %w", ob.Table(), n, err)
		}
		ob.mapper, ob.source = m, cfg.Source
	}
	return nil
}
