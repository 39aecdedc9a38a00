package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/shard"
)

// holderInterval is how often a standby asks for the shards' lock and the
// holder checks that it still holds it: a takeover within seconds, as a
// standby of one slot.
const holderInterval = time.Second

// Shards is a stream split over Config.Shards slots: a Relay per shard,
// each with its own publication (a row filter on the hash of the aggregate
// id), slot, position and checkpoint, in one process under one holder
// (replication.Holder). A stream that is not split is one Relay and no
// holder, as before shards.
type Shards struct {
	relays []*Relay
	holder *replication.Holder
	log    *slog.Logger
}

// NewShards assembles the stream's shards (New for each, in turn: each
// prepares its publication and slot). The holder is not taken yet: Run
// takes it before any shard takes its slot.
func NewShards(ctx context.Context, cfg Config, g Group, obs Observer, log *slog.Logger) (*Shards, error) {
	s := &Shards{log: log}
	if cfg.Shards <= 1 {
		r, err := New(ctx, cfg, g, obs, log)
		if err != nil {
			return nil, err
		}
		s.relays = []*Relay{r}
		return s, nil
	}
	s.holder = replication.NewHolder(cfg.PostgresURL, cfg.Slot, holderInterval, log)
	for _, sh := range shard.All(cfg.Shards) {
		c := cfg
		c.Shard = sh
		if sh.Index > 0 {
			c.Kafka.Opts = cfg.ShardKafkaOpts
		}
		o := obs
		if cfg.ShardObserver != nil {
			o = cfg.ShardObserver(sh.Name(cfg.Slot))
		}
		r, err := New(ctx, c, g, o, log.With("shard", sh.String()))
		if err != nil {
			return nil, fmt.Errorf("shard %s: %w", sh, err)
		}
		s.relays = append(s.relays, r)
	}
	return s, nil
}

// Relays are the shards' relays, in the order of their index.
func (s *Shards) Relays() []*Relay { return s.relays }

// Waiting reports whether another process holds the shards and this one
// waits for them (a standby).
func (s *Shards) Waiting() bool { return s.holder != nil && s.holder.Waiting() }

// Run streams every shard until ctx ends (a clean stop of all: nil) or one
// fails, which stops the others (each drains and confirms what Kafka
// acknowledged) and is returned. With several shards it first waits for
// the holder's lock, and stops all when the lock is lost to another
// process: one process holds all the shards or none.
func (s *Shards) Run(ctx context.Context) error {
	if s.holder == nil {
		return s.relays[0].Run(ctx)
	}
	if err := s.holder.Take(ctx); err != nil {
		return err
	}
	s.log.Info("holds the stream's shards", "shards", len(s.relays))
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	errs := make([]error, len(s.relays)+1)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.holder.Hold(ctx); err != nil {
			errs[len(s.relays)] = err
			stop()
		}
	})
	for i, r := range s.relays {
		wg.Go(func() {
			if err := r.Run(ctx); err != nil {
				errs[i] = fmt.Errorf("shard %s: %w", r.cfg.Shard, err)
			}
			// A shard that stopped (failed, or a clean stop) stops the
			// others: no shard streams without the rest.
			stop()
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
