package checkpoint_test

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
)

// BenchmarkAddAck is the per-record cost: one Add and one Ack.
func BenchmarkAddAck(b *testing.B) {
	tr := checkpoint.New(0)
	tx := tr.Begin(time.Time{})
	b.ReportAllocs()
	for b.Loop() {
		tr.Add(tx, 1)
		tr.Ack(tx)
	}
}

// BenchmarkTxCycle is one single-record transaction: Begin, Add, Commit, Ack.
func BenchmarkTxCycle(b *testing.B) {
	tr := checkpoint.New(0)
	var lsn pglogrepl.LSN
	b.ReportAllocs()
	for b.Loop() {
		lsn++
		tx := tr.Begin(time.Time{})
		tr.Add(tx, 1)
		tr.Commit(tx, lsn)
		tr.Ack(tx)
	}
}

// BenchmarkTxCyclePipelined keeps 1024 committed transactions of 10 records
// waiting for acks, as when the broker lags: each iteration acks the oldest
// one's records and begins a new one, so the queue stays 1024 deep.
func BenchmarkTxCyclePipelined(b *testing.B) {
	const window, records = 1024, 10
	tr := checkpoint.New(0)
	ring := make([]*checkpoint.Tx, window)
	var lsn pglogrepl.LSN
	b.ReportAllocs()
	for b.Loop() {
		lsn++
		slot := int(lsn) % window
		if old := ring[slot]; old != nil {
			for range records {
				tr.Ack(old)
			}
		}
		tx := tr.Begin(time.Time{})
		tr.Add(tx, records)
		tr.Commit(tx, lsn)
		ring[slot] = tx
	}
}

// BenchmarkAckParallel measures Ack under contention from several goroutines.
func BenchmarkAckParallel(b *testing.B) {
	tr := checkpoint.New(0)
	tx := tr.Begin(time.Time{})
	tr.Add(tx, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tr.Ack(tx)
		}
	})
}
