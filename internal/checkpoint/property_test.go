package checkpoint_test

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
)

// model is the brute-force reference: it keeps every transaction ever begun
// and recomputes everything from scratch after each step.
type model struct {
	start pglogrepl.LSN
	idle  pglogrepl.LSN // highest keepalive position accepted
	txs   []*mtx
}

type mtx struct {
	h               *checkpoint.Tx
	commitTime      time.Time
	added, acked    int
	committed, gone bool // gone: discarded
	end             pglogrepl.LSN
	// held: records were still in flight at its Commit, so it keeps an
	// entry of its own in the Tracker's queue until confirmed.
	held bool
}

// prefix returns how many transactions (discarded ones skipped) form the
// complete prefix, and the confirmed position that prefix implies.
func (m *model) prefix() (complete int, confirmed pglogrepl.LSN, incomplete *mtx) {
	confirmed = max(m.start, m.idle)
	for _, x := range m.txs {
		if x.gone {
			continue
		}
		if !x.committed || x.acked != x.added {
			return complete, confirmed, x
		}
		complete++
		confirmed = max(confirmed, x.end)
	}
	return complete, confirmed, nil
}

func (m *model) pending() int {
	n := 0
	for _, x := range m.txs {
		if !x.gone {
			n++
		}
	}
	complete, _, _ := m.prefix()
	return n - complete
}

func TestRandomized(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 42))
		start := pglogrepl.LSN(rng.IntN(1000))
		m := &model{start: start}
		tr := checkpoint.New(start)
		lsn := start + pglogrepl.LSN(rng.IntN(50)) // next commit end grows from here
		var open *mtx
		type rec struct{ x *mtx }
		var unacked []rec // records in flight, in no particular order
		var log []string
		last := tr.Confirmed()

		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d after %v: "+format, append([]any{seed, log}, args...)...)
		}
		for range 400 {
			ch := tr.Wait()
			switch r := rng.IntN(100); {
			case open == nil && r < 25:
				x := &mtx{commitTime: time.Unix(int64(len(m.txs)), 0)}
				x.h = tr.Begin(x.commitTime)
				m.txs = append(m.txs, x)
				open = x
				log = append(log, "B")
			case open != nil && r < 30:
				n := rng.IntN(4)
				tr.Add(open.h, n)
				open.added += n
				for range n {
					unacked = append(unacked, rec{open})
				}
				log = append(log, "+")
			case open != nil && r < 40:
				if rng.IntN(10) == 0 {
					// A reconnect: PostgreSQL resends from an older position.
					lsn -= pglogrepl.LSN(rng.IntN(int(lsn-start) + 1))
				} else {
					lsn += pglogrepl.LSN(1 + rng.IntN(100))
				}
				tr.Commit(open.h, lsn)
				open.committed, open.end, open.held = true, lsn, open.acked < open.added
				open = nil
				log = append(log, "C")
			case open != nil && r < 43:
				tr.Discard(open.h)
				open.gone = true
				open = nil
				log = append(log, "D")
			case r < 55:
				_, conf, inc := m.prefix()
				walEnd := pglogrepl.LSN(max(0, int(lsn)+rng.IntN(100)-50)) // around the stream position, sometimes behind
				want := inc == nil && walEnd > conf
				if got := tr.Idle(walEnd); got != want {
					fail("Idle(%d) = %v, want %v", walEnd, got, want)
				}
				if want {
					m.idle = walEnd
				}
				log = append(log, "I")
			case len(unacked) > 0:
				i := rng.IntN(len(unacked))
				x := unacked[i].x
				unacked[i] = unacked[len(unacked)-1]
				unacked = unacked[:len(unacked)-1]
				tr.Ack(x.h)
				if !x.gone {
					x.acked++
				}
				log = append(log, "A")
			default:
				continue
			}

			complete, want, inc := m.prefix()
			got := tr.Confirmed()
			if got != want {
				fail("Confirmed = %d, want %d", got, want)
			}
			if got < last {
				fail("Confirmed went back from %d to %d", last, got)
			}
			if closed := isClosed(ch); closed != (got > last) {
				fail("Wait channel closed = %v, Confirmed %d -> %d", closed, last, got)
			}
			last = got
			if p := tr.Pending(); p != m.pending() {
				fail("Pending = %d, want %d", p, m.pending())
			}
			if n := tr.Transactions(); n != uint64(complete) {
				fail("Transactions = %d, want %d", n, complete)
			}
			// Memory stays bounded by what is in flight: transactions
			// complete at their Commit are folded, not queued.
			held, seen := 0, 0
			for _, x := range m.txs {
				if x.gone {
					continue
				}
				if seen++; seen > complete && (x.held || !x.committed) {
					held++
				}
			}
			if e := tr.Entries(); e > held+1 {
				fail("%d queue entries for %d transactions held by records in flight or open", e, held)
			}
			ct, ok := tr.Oldest()
			if ok != (inc != nil) || (inc != nil && !ct.Equal(inc.commitTime)) {
				fail("Oldest = %v, %v; want %v", ct, ok, inc)
			}
		}
	}
}

// TestConcurrent runs the replication side and several ack goroutines at once
// (run it with -race). Transaction i ends at 1000*(i+1) and keepalives report
// positions between transactions, so a confirmed position C covers exactly the
// transactions i < C/1000: an observer checks that all their records had been
// acked, and that C never goes back.
func TestConcurrent(t *testing.T) {
	const txs = 3000
	tr := checkpoint.New(0)
	records := make([]int, txs)
	acked := make([]atomic.Int32, txs) // incremented just before Ack
	type rec struct {
		tx *checkpoint.Tx
		i  int
	}
	work := make(chan rec, 256)

	var acks sync.WaitGroup
	for w := range 4 {
		acks.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var held []rec // hold some back to shuffle the order
			for r := range work {
				held = append(held, r)
				if len(held) < 8 {
					continue
				}
				k := rng.IntN(len(held))
				acked[held[k].i].Add(1)
				tr.Ack(held[k].tx)
				held[k] = held[len(held)-1]
				held = held[:len(held)-1]
			}
			for _, r := range held {
				acked[r.i].Add(1)
				tr.Ack(r.tx)
			}
		})
	}

	stop := make(chan struct{})
	var observer sync.WaitGroup
	observer.Go(func() {
		var last pglogrepl.LSN
		for {
			ch := tr.Wait()
			c := tr.Confirmed()
			if c < last {
				t.Errorf("Confirmed went back from %d to %d", last, c)
				return
			}
			for i := int(last / 1000); i < int(c/1000) && i < txs; i++ {
				if got := int(acked[i].Load()); got != records[i] {
					t.Errorf("Confirmed %d covers transaction %d with %d of %d records acked", c, i, got, records[i])
					return
				}
			}
			last = c
			tr.Pending()
			tr.Oldest()
			select {
			case <-ch:
			case <-stop:
				return
			}
		}
	})

	rng := rand.New(rand.NewPCG(1, 2))
	for i := range txs {
		records[i] = rng.IntN(5)
		tx := tr.Begin(time.Unix(int64(i), 0))
		tr.Add(tx, records[i])
		for range records[i] {
			work <- rec{tx, i}
		}
		tr.Commit(tx, pglogrepl.LSN(1000*(i+1)))
		if rng.IntN(4) == 0 {
			tr.Idle(pglogrepl.LSN(1000*(i+1) + 500))
		}
	}
	close(work)
	acks.Wait()
	close(stop)
	observer.Wait()

	if got, want := tr.Confirmed(), pglogrepl.LSN(1000*txs); got != want {
		t.Fatalf("Confirmed = %d, want %d", got, want)
	}
	if got := tr.Pending(); got != 0 {
		t.Fatalf("Pending = %d, want 0", got)
	}
	if got := tr.Transactions(); got != txs {
		t.Fatalf("Transactions = %d, want %d", got, txs)
	}
}
