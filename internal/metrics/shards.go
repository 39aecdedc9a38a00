package metrics

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Shards are the metrics of a stream split over several slots: each
// shard's slot by its name (the slot label), and the stream's own slot
// metrics as its worst shard's, so that dashboards and alerts written for
// one slot hold for the stream.
//
//	cdc_outbox_shard_slot_retained_wal_bytes{slot}  gauge  the shard's slot's retained WAL
//	cdc_outbox_shard_slot_active{slot}              gauge  1 while a process streams from the shard's slot
//	cdc_outbox_shard_replication_lag_bytes{slot}    gauge  the shard's received minus confirmed LSN
//
// cdc_outbox_slot_retained_wal_bytes is then the most any shard retains,
// cdc_outbox_slot_active 1 while every shard's slot is active, and
// cdc_outbox_slot_wal_status the worst shard's wal_status.
type Shards struct {
	m        *Metrics
	f        promauto.Factory
	retained *prometheus.GaugeVec
	active   *prometheus.GaugeVec

	mu    sync.Mutex
	slots map[string]slotState
	fo    map[string]failoverState
}

type slotState struct {
	active    bool
	retained  int64
	walStatus string
}

type failoverState struct {
	failover, ready bool
	standbys        map[string]string
	blocking        int
}

// Shards creates the per-shard metrics on reg, the registry of m.
func (m *Metrics) Shards(reg prometheus.Registerer) *Shards {
	f := promauto.With(reg)
	return &Shards{m: m, f: f, slots: map[string]slotState{}, fo: map[string]failoverState{},
		retained: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cdc_outbox_shard_slot_retained_wal_bytes", Help: "WAL the shard's replication slot makes PostgreSQL keep: pg_current_wal_lsn() - restart_lsn.",
		}, []string{"slot"}),
		active: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cdc_outbox_shard_slot_active", Help: "1 while a process streams from the shard's replication slot.",
		}, []string{"slot"}),
	}
}

// Lag reads the shard's replication lag at scrape time.
func (s *Shards) Lag(slot string, lag func() float64) {
	s.f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cdc_outbox_shard_replication_lag_bytes", Help: "The shard's newest server WAL end seen minus its confirmed LSN.",
		ConstLabels: prometheus.Labels{"slot": slot},
	}, lag)
}

// Shard is the observer of the shard streaming slot: *Metrics but for the
// slot's state, which it records per shard and sums up for the stream.
func (s *Shards) Shard(slot string) *Shard { return &Shard{Metrics: s.m, s: s, slot: slot} }

// Shard observes one shard (Shards.Shard).
type Shard struct {
	*Metrics
	s    *Shards
	slot string
}

// walRank orders wal_status from the best to the worst.
var walRank = []string{"", "reserved", "extended", "unreserved", "lost"}

// Slot records the shard's slot, and the stream's as its worst shard's.
func (sh *Shard) Slot(active bool, retainedBytes int64, walStatus string) {
	s := sh.s
	s.retained.WithLabelValues(sh.slot).Set(float64(retainedBytes))
	s.active.WithLabelValues(sh.slot).Set(b2f(active))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slots[sh.slot] = slotState{active, retainedBytes, walStatus}
	worst := slotState{active: true}
	for _, st := range s.slots {
		worst.active = worst.active && st.active
		worst.retained = max(worst.retained, st.retained)
		if slices.Index(walRank, st.walStatus) > slices.Index(walRank, worst.walStatus) {
			worst.walStatus = st.walStatus
		}
	}
	s.m.Slot(worst.active, worst.retained, worst.walStatus)
}

// SlotFailover records the stream's failover state as the worst shard's:
// a failover keeps the stream only when it keeps every shard.
func (sh *Shard) SlotFailover(failover, ready bool, standbys map[string]string) {
	s := sh.s
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.fo[sh.slot]
	st.failover, st.ready, st.standbys = failover, ready, standbys
	s.fo[sh.slot] = st
	all := failoverState{failover: true, ready: true}
	for _, st := range s.fo {
		all.failover = all.failover && st.failover
		if all.ready && !st.ready || all.standbys == nil {
			all.standbys = st.standbys
		}
		all.ready = all.ready && st.ready
	}
	s.m.SlotFailover(all.failover, all.ready, all.standbys)
}

// StandbySlotsBlocking records the most blocking slots any shard sees.
func (sh *Shard) StandbySlotsBlocking(n int) {
	s := sh.s
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.fo[sh.slot]
	st.blocking = n
	s.fo[sh.slot] = st
	most := 0
	for _, st := range s.fo {
		most = max(most, st.blocking)
	}
	s.m.StandbySlotsBlocking(most)
}
