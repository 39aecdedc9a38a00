package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestShardsWorstSlot: with two shards, each slot has its series, and the
// stream's slot metrics are the worst shard's: active only while both are,
// the most retained WAL, the worst wal_status; a failover keeps the stream
// only when it keeps both.
func TestShardsWorstSlot(t *testing.T) {
	m, reg := newTestMetrics(t, true)
	s := m.Shards(reg)
	a, b := s.Shard("s_shard_0_of_2"), s.Shard("s_shard_1_of_2")
	s.Lag("s_shard_0_of_2", func() float64 { return 10 })
	s.Lag("s_shard_1_of_2", func() float64 { return 700 })
	a.Slot(true, 100, "reserved")
	b.Slot(false, 300, "extended")
	a.SlotFailover(true, true, map[string]string{"db-2:5432": "ready"})
	b.SlotFailover(true, false, map[string]string{"db-2:5432": "behind"})
	a.StandbySlotsBlocking(0)
	b.StandbySlotsBlocking(1)
	want := `
# HELP cdc_outbox_shard_replication_lag_bytes The shard's newest server WAL end seen minus its confirmed LSN.
# TYPE cdc_outbox_shard_replication_lag_bytes gauge
cdc_outbox_shard_replication_lag_bytes{slot="s_shard_0_of_2"} 10
cdc_outbox_shard_replication_lag_bytes{slot="s_shard_1_of_2"} 700
# HELP cdc_outbox_shard_slot_active 1 while a process streams from the shard's replication slot.
# TYPE cdc_outbox_shard_slot_active gauge
cdc_outbox_shard_slot_active{slot="s_shard_0_of_2"} 1
cdc_outbox_shard_slot_active{slot="s_shard_1_of_2"} 0
# HELP cdc_outbox_shard_slot_retained_wal_bytes WAL the shard's replication slot makes PostgreSQL keep: pg_current_wal_lsn() - restart_lsn.
# TYPE cdc_outbox_shard_slot_retained_wal_bytes gauge
cdc_outbox_shard_slot_retained_wal_bytes{slot="s_shard_0_of_2"} 100
cdc_outbox_shard_slot_retained_wal_bytes{slot="s_shard_1_of_2"} 300
# HELP cdc_outbox_slot_active 1 while a process streams from the replication slot.
# TYPE cdc_outbox_slot_active gauge
cdc_outbox_slot_active 0
# HELP cdc_outbox_slot_failover_ready 1 when a failover keeps the stream: the slot is a failover slot, and every standby the connection string names holds a synchronized, persistent copy close to the primary's position.
# TYPE cdc_outbox_slot_failover_ready gauge
cdc_outbox_slot_failover_ready 0
# HELP cdc_outbox_slot_failover_standby 1 for the state of each standby's copy of the slot: ready, temporary (dropped at promotion), behind, missing, not_synced, invalidated or unreachable.
# TYPE cdc_outbox_slot_failover_standby gauge
cdc_outbox_slot_failover_standby{standby="db-2:5432",state="behind"} 1
# HELP cdc_outbox_slot_retained_wal_bytes WAL the replication slot makes PostgreSQL keep: pg_current_wal_lsn() - restart_lsn.
# TYPE cdc_outbox_slot_retained_wal_bytes gauge
cdc_outbox_slot_retained_wal_bytes 300
# HELP cdc_outbox_standby_slots_blocking Slots named in the primary's synchronized_standby_slots that hold the failover slot's walsender back (missing, logical, invalidated, or no standby streaming from them).
# TYPE cdc_outbox_standby_slots_blocking gauge
cdc_outbox_standby_slots_blocking 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"cdc_outbox_shard_replication_lag_bytes", "cdc_outbox_shard_slot_active", "cdc_outbox_shard_slot_retained_wal_bytes",
		"cdc_outbox_slot_active", "cdc_outbox_slot_failover_ready", "cdc_outbox_slot_failover_standby", "cdc_outbox_slot_retained_wal_bytes",
		"cdc_outbox_standby_slots_blocking"); err != nil {
		t.Error(err)
	}
	if v := testutil.ToFloat64(m.slotWALStatus.WithLabelValues("extended")); v != 1 {
		t.Errorf("cdc_outbox_slot_wal_status{status=extended} = %v, want 1 (the worst shard's)", v)
	}
	// The first shard's slot going inactive and the second's back: still
	// one inactive.
	b.Slot(true, 50, "reserved")
	a.Slot(false, 100, "reserved")
	if v := testutil.ToFloat64(m.slotActive); v != 0 {
		t.Errorf("cdc_outbox_slot_active = %v with one shard's slot inactive", v)
	}
	a.Slot(true, 100, "reserved")
	if v := testutil.ToFloat64(m.slotActive); v != 1 {
		t.Errorf("cdc_outbox_slot_active = %v with every shard's slot active", v)
	}
	if v := testutil.ToFloat64(m.slotRetained); v != 100 {
		t.Errorf("cdc_outbox_slot_retained_wal_bytes = %v, want 100", v)
	}
}
