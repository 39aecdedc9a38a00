package checkpoint_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
)

type opKind int

const (
	opBegin   opKind = iota // begin the next transaction (tx indexes count Begins from 0)
	opAdd                   // Add(tx, n)
	opCommit                // Commit(tx, lsn)
	opAck                   // Ack(tx)
	opDiscard               // Discard(tx)
	opIdle                  // Idle(lsn) must report moved
)

type step struct {
	op    opKind
	tx    int
	n     int
	lsn   pglogrepl.LSN
	moved bool          // opIdle: expected result
	want  pglogrepl.LSN // Confirmed after the step
}

func (s step) String() string {
	switch s.op {
	case opBegin:
		return fmt.Sprintf("Begin(T%d)", s.tx)
	case opAdd:
		return fmt.Sprintf("Add(T%d, %d)", s.tx, s.n)
	case opCommit:
		return fmt.Sprintf("Commit(T%d, %d)", s.tx, s.lsn)
	case opAck:
		return fmt.Sprintf("Ack(T%d)", s.tx)
	case opDiscard:
		return fmt.Sprintf("Discard(T%d)", s.tx)
	case opIdle:
		return fmt.Sprintf("Idle(%d)", s.lsn)
	}
	return "?"
}

func begin(tx int, want pglogrepl.LSN) step   { return step{op: opBegin, tx: tx, want: want} }
func add(tx, n int, want pglogrepl.LSN) step  { return step{op: opAdd, tx: tx, n: n, want: want} }
func ack(tx int, want pglogrepl.LSN) step     { return step{op: opAck, tx: tx, want: want} }
func discard(tx int, want pglogrepl.LSN) step { return step{op: opDiscard, tx: tx, want: want} }
func commit(tx int, end, want pglogrepl.LSN) step {
	return step{op: opCommit, tx: tx, lsn: end, want: want}
}
func idle(walEnd pglogrepl.LSN, moved bool, want pglogrepl.LSN) step {
	return step{op: opIdle, lsn: walEnd, moved: moved, want: want}
}

// run applies steps to a Tracker starting at 100 and checks Confirmed after
// each one, and that Wait's channel closed exactly when Confirmed rose.
func run(t *testing.T, steps []step) *checkpoint.Tracker {
	t.Helper()
	tr := checkpoint.New(100)
	var txs []*checkpoint.Tx
	var trace []string
	for i, s := range steps {
		trace = append(trace, s.String())
		before := tr.Confirmed()
		ch := tr.Wait()
		switch s.op {
		case opBegin:
			if s.tx != len(txs) {
				t.Fatalf("bad test: step %d begins T%d, next is T%d", i, s.tx, len(txs))
			}
			txs = append(txs, tr.Begin(time.Unix(int64(s.tx), 0)))
		case opAdd:
			tr.Add(txs[s.tx], s.n)
		case opCommit:
			tr.Commit(txs[s.tx], s.lsn)
		case opAck:
			tr.Ack(txs[s.tx])
		case opDiscard:
			tr.Discard(txs[s.tx])
		case opIdle:
			if got := tr.Idle(s.lsn); got != s.moved {
				t.Fatalf("after %s: Idle returned %v, want %v", strings.Join(trace, " "), got, s.moved)
			}
		}
		got := tr.Confirmed()
		if got != s.want {
			t.Fatalf("after %s: Confirmed = %d, want %d", strings.Join(trace, " "), got, s.want)
		}
		if closed := isClosed(ch); closed != (got > before) {
			t.Fatalf("after %s: Wait channel closed = %v, Confirmed %d -> %d", strings.Join(trace, " "), closed, before, got)
		}
	}
	return tr
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestArithmetic(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"ack after commit", []step{
			begin(0, 100), add(0, 2, 100), commit(0, 200, 100), ack(0, 100), ack(0, 200),
		}},
		{"acks before commit", []step{
			begin(0, 100), add(0, 2, 100), ack(0, 100), ack(0, 100), commit(0, 200, 200),
		}},
		{"ack between adds", []step{
			begin(0, 100), add(0, 1, 100), ack(0, 100), add(0, 1, 100), commit(0, 200, 100), ack(0, 200),
		}},
		{"empty transaction completes at commit", []step{
			begin(0, 100), commit(0, 200, 200), begin(1, 200), add(1, 0, 200), commit(1, 300, 300),
		}},
		{"empty transaction waits for older one", []step{
			begin(0, 100), add(0, 1, 100), commit(0, 200, 100),
			begin(1, 100), commit(1, 300, 100),
			ack(0, 300),
		}},
		{"newer acked first waits for older", []step{
			begin(0, 100), add(0, 1, 100), commit(0, 200, 100),
			begin(1, 100), add(1, 1, 100), commit(1, 300, 100),
			begin(2, 100), add(2, 1, 100), commit(2, 400, 100),
			ack(2, 100), ack(1, 100), ack(0, 400),
		}},
		{"middle acked first", []step{
			begin(0, 100), add(0, 1, 100), commit(0, 200, 100),
			begin(1, 100), add(1, 1, 100), commit(1, 300, 100),
			begin(2, 100), add(2, 1, 100), commit(2, 400, 100),
			ack(1, 100), ack(0, 300), ack(2, 400),
		}},
		{"acked older transaction waits for nothing newer", []step{
			begin(0, 100), add(0, 1, 100), commit(0, 200, 100),
			begin(1, 100), add(1, 1, 100),
			ack(0, 200), commit(1, 300, 200), ack(1, 300),
		}},
		{"fully acked open transaction discarded, then resent", []step{
			begin(0, 100), add(0, 1, 100), ack(0, 100), discard(0, 100),
			begin(1, 100), add(1, 1, 100), ack(1, 100), commit(1, 300, 300),
		}},
		{"commit below confirmed does not go back", []step{
			begin(0, 100), commit(0, 500, 500),
			begin(1, 500), add(1, 1, 500), commit(1, 300, 500), ack(1, 500), // resent after a reconnect
			begin(2, 500), commit(2, 600, 600),
		}},
		{"commit below start does not go back", []step{
			begin(0, 100), commit(0, 50, 100),
		}},
		{"idle when nothing pending", []step{
			idle(150, true, 150), idle(150, false, 150), idle(170, true, 170),
		}},
		{"idle never backwards", []step{
			idle(90, false, 100), begin(0, 100), commit(0, 300, 300), idle(250, false, 300), idle(300, false, 300), idle(301, true, 301),
		}},
		{"idle blocked by open transaction", []step{
			begin(0, 100), idle(150, false, 100), commit(0, 200, 200), idle(250, true, 250),
		}},
		{"idle blocked by in-flight records of open transaction", []step{
			begin(0, 100), add(0, 1, 100), idle(150, false, 100), ack(0, 100), idle(150, false, 100),
			commit(0, 200, 200), idle(250, true, 250),
		}},
		{"idle blocked by committed but unacked transaction", []step{
			begin(0, 100), add(0, 2, 100), commit(0, 200, 100), idle(250, false, 100),
			ack(0, 100), idle(250, false, 100), ack(0, 200), idle(250, true, 250),
		}},
		{"idle after discard", []step{
			begin(0, 100), add(0, 3, 100), ack(0, 100), discard(0, 100), idle(150, true, 150),
		}},
		{"discard then stray acks", []step{
			begin(0, 100), add(0, 1, 100), commit(0, 200, 100),
			begin(1, 100), add(1, 2, 100), ack(1, 100), discard(1, 100),
			ack(1, 100), ack(1, 100), ack(1, 100), // stray acks of the lost tx, even extra ones
			ack(0, 200),
			// The resend of T1 is a new transaction.
			begin(2, 200), add(2, 2, 200), commit(2, 300, 200), ack(2, 200), ack(2, 300),
		}},
		{"discard while older is pending", []step{
			begin(0, 100), add(0, 1, 100), commit(0, 200, 100),
			begin(1, 100), add(1, 1, 100), discard(1, 100),
			ack(0, 200), ack(1, 200),
		}},
		{"double discard is a no-op", []step{
			begin(0, 100), discard(0, 100), discard(0, 100), begin(1, 100), commit(1, 200, 200),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { run(t, tc.steps) })
	}
}

// TestEveryInterleaving feeds the replication stream of four transactions
// (T0: 2 records, T1: 1, T2: empty, T3: 2) and interleaves the acks at every
// possible point and in every order, checking Confirmed after each step
// against the rule: the end of the newest committed transaction whose own and
// older records are all acked.
func TestEveryInterleaving(t *testing.T) {
	records := []int{2, 1, 0, 2}
	ends := []pglogrepl.LSN{200, 300, 400, 500}
	var stream []string // B<i> Begin, +<i> Add(1), C<i> Commit, in stream order
	for i, n := range records {
		stream = append(stream, fmt.Sprintf("B%d", i))
		for range n {
			stream = append(stream, fmt.Sprintf("+%d", i))
		}
		stream = append(stream, fmt.Sprintf("C%d", i))
	}

	// Enumerate every trace: at each point either the next stream event or an
	// Ack (A<i>) of any added and not yet acked record.
	orders := 0
	added, acked := make([]int, len(records)), make([]int, len(records))
	var trace []string
	var walk func(next int)
	walk = func(next int) {
		if next == len(stream) && slices.Equal(acked, records) {
			orders++
			replay(t, trace, ends)
			return
		}
		if next < len(stream) {
			e := stream[next]
			i := int(e[1] - '0')
			if e[0] == '+' {
				added[i]++
			}
			trace = append(trace, e)
			walk(next + 1)
			trace = trace[:len(trace)-1]
			if e[0] == '+' {
				added[i]--
			}
		}
		for i := range records {
			if acked[i] < added[i] {
				acked[i]++
				trace = append(trace, fmt.Sprintf("A%d", i))
				walk(next)
				trace = trace[:len(trace)-1]
				acked[i]--
			}
		}
	}
	walk(0)
	if orders < 1000 {
		t.Fatalf("only %d interleavings explored", orders)
	}
	t.Logf("%d interleavings", orders)
}

// replay runs one complete trace on a fresh Tracker, checking Confirmed after
// every step against the brute-force rule.
func replay(t *testing.T, trace []string, ends []pglogrepl.LSN) {
	t.Helper()
	n := len(ends)
	tr := checkpoint.New(100)
	txs := make([]*checkpoint.Tx, n)
	added, acked, committed := make([]int, n), make([]int, n), make([]bool, n)
	for k, e := range trace {
		i := int(e[1] - '0')
		switch e[0] {
		case 'B':
			txs[i] = tr.Begin(time.Time{})
		case '+':
			tr.Add(txs[i], 1)
			added[i]++
		case 'A':
			tr.Ack(txs[i])
			acked[i]++
		case 'C':
			tr.Commit(txs[i], ends[i])
			committed[i] = true
		}
		want := pglogrepl.LSN(100)
		for j := range n {
			if !committed[j] || acked[j] != added[j] {
				break
			}
			want = ends[j]
		}
		if got := tr.Confirmed(); got != want {
			t.Fatalf("after %s: Confirmed = %d, want %d", strings.Join(trace[:k+1], " "), got, want)
		}
	}
	if got := tr.Pending(); got != 0 {
		t.Fatalf("after %s: Pending = %d, want 0", strings.Join(trace, " "), got)
	}
	if got := tr.Transactions(); got != uint64(n) {
		t.Fatalf("after %s: Transactions = %d, want %d", strings.Join(trace, " "), got, n)
	}
}

func TestPendingOldestTransactions(t *testing.T) {
	tr := checkpoint.New(0)
	if _, ok := tr.Oldest(); ok {
		t.Fatal("Oldest ok on an empty Tracker")
	}
	t0 := tr.Begin(time.Unix(10, 0))
	tr.Add(t0, 1)
	tr.Commit(t0, 10)
	t1 := tr.Begin(time.Unix(20, 0))
	if got := tr.Pending(); got != 2 {
		t.Fatalf("Pending = %d, want 2", got)
	}
	if ct, ok := tr.Oldest(); !ok || !ct.Equal(time.Unix(10, 0)) {
		t.Fatalf("Oldest = %v, %v; want 10s", ct, ok)
	}
	tr.Ack(t0)
	if ct, ok := tr.Oldest(); !ok || !ct.Equal(time.Unix(20, 0)) {
		t.Fatalf("Oldest = %v, %v; want 20s (the open transaction)", ct, ok)
	}
	if got, want := tr.Transactions(), uint64(1); got != want {
		t.Fatalf("Transactions = %d, want %d", got, want)
	}
	tr.Discard(t1)
	if got := tr.Pending(); got != 0 {
		t.Fatalf("Pending after Discard = %d, want 0", got)
	}
	if _, ok := tr.Oldest(); ok {
		t.Fatal("Oldest ok after the only pending transaction was discarded")
	}
	if got := tr.Transactions(); got != 1 {
		t.Fatalf("Transactions after Discard = %d, want 1 (discarded ones do not count)", got)
	}
}

func TestWait(t *testing.T) {
	tr := checkpoint.New(100)
	ch := tr.Wait()
	if tr.Wait() != ch {
		t.Fatal("Wait returned a different channel before any advance")
	}
	tx := tr.Begin(time.Time{})
	tr.Add(tx, 1)
	tr.Commit(tx, 50) // below the start: no advance
	tr.Ack(tx)
	if isClosed(ch) {
		t.Fatal("Wait channel closed without an advance")
	}
	tx = tr.Begin(time.Time{})
	tr.Add(tx, 1)
	tr.Commit(tx, 200)
	if isClosed(ch) {
		t.Fatal("Wait channel closed before the ack")
	}
	done := make(chan struct{})
	go func() {
		<-ch
		close(done)
	}()
	tr.Ack(tx)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken by the advance")
	}
	next := tr.Wait()
	if next == ch || isClosed(next) {
		t.Fatal("Wait after an advance must return a fresh open channel")
	}
	tr.Idle(300)
	if !isClosed(next) {
		t.Fatal("Wait channel not closed by an Idle advance")
	}
}

func TestPanics(t *testing.T) {
	tests := []struct {
		name string
		do   func(tr *checkpoint.Tracker)
		msg  string
	}{
		{"more acks than adds", func(tr *checkpoint.Tracker) {
			tx := tr.Begin(time.Time{})
			tr.Add(tx, 1)
			tr.Ack(tx)
			tr.Ack(tx)
		}, "more Acks than Adds"},
		{"ack after confirmed", func(tr *checkpoint.Tracker) {
			tx := tr.Begin(time.Time{})
			tr.Add(tx, 1)
			tr.Commit(tx, 200)
			tr.Ack(tx)
			tr.Ack(tx)
		}, "more Acks than Adds"},
		{"ack with no add", func(tr *checkpoint.Tracker) {
			tr.Ack(tr.Begin(time.Time{}))
		}, "more Acks than Adds"},
		{"add after commit", func(tr *checkpoint.Tracker) {
			tx := tr.Begin(time.Time{})
			tr.Add(tx, 1)
			tr.Commit(tx, 200)
			tr.Add(tx, 1)
		}, "before Commit"},
		{"negative add", func(tr *checkpoint.Tracker) {
			tr.Add(tr.Begin(time.Time{}), -1)
		}, "negative"},
		{"begin while open", func(tr *checkpoint.Tracker) {
			tr.Begin(time.Time{})
			tr.Begin(time.Time{})
		}, "another transaction is open"},
		{"commit twice", func(tr *checkpoint.Tracker) {
			tx := tr.Begin(time.Time{})
			tr.Commit(tx, 200)
			tr.Commit(tx, 300)
		}, "Commit of a confirmed transaction"},
		{"commit discarded", func(tr *checkpoint.Tracker) {
			tx := tr.Begin(time.Time{})
			tr.Discard(tx)
			tr.Commit(tx, 200)
		}, "Commit of a discarded transaction"},
		{"commit another tracker's tx", func(tr *checkpoint.Tracker) {
			tx := checkpoint.New(0).Begin(time.Time{})
			tr.Commit(tx, 200)
		}, "not this Tracker's open transaction"},
		{"discard committed", func(tr *checkpoint.Tracker) {
			tx := tr.Begin(time.Time{})
			tr.Add(tx, 1)
			tr.Commit(tx, 200)
			tr.Discard(tx)
		}, "only the open transaction can be discarded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := checkpoint.New(100)
			defer func() {
				r := recover()
				msg, _ := r.(string)
				if !strings.HasPrefix(msg, "checkpoint: ") || !strings.Contains(msg, tc.msg) {
					t.Fatalf("panic %v, want a checkpoint panic containing %q", r, tc.msg)
				}
				// The Tracker's mutex must not be left locked by the panic.
				done := make(chan struct{})
				go func() { tr.Confirmed(); close(done) }()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Fatal("Tracker locked after panic")
				}
			}()
			tc.do(tr)
		})
	}
}

// TestQueueGrowth grows the ring buffer while its head is not at index 0 (some
// transactions were already confirmed), then acks in reverse order, so a
// growth that lost the FIFO order would confirm the wrong transaction.
func TestQueueGrowth(t *testing.T) {
	tr := checkpoint.New(0)
	for i := range 5 { // move the head off 0
		tr.Commit(tr.Begin(time.Time{}), pglogrepl.LSN(i+1))
	}
	const n = 100
	txs := make([]*checkpoint.Tx, n)
	for i := range n {
		txs[i] = tr.Begin(time.Unix(int64(i), 0))
		tr.Add(txs[i], 1)
		tr.Commit(txs[i], pglogrepl.LSN(100+i))
	}
	if got := tr.Pending(); got != n {
		t.Fatalf("Pending = %d, want %d", got, n)
	}
	for i := n - 1; i > 0; i-- {
		tr.Ack(txs[i])
		if got := tr.Confirmed(); got != 5 {
			t.Fatalf("after acking T%d..T%d: Confirmed = %d, want 5", i, n-1, got)
		}
		if ct, _ := tr.Oldest(); !ct.Equal(time.Unix(0, 0)) {
			t.Fatalf("Oldest = %v, want the first pending transaction's", ct)
		}
	}
	tr.Ack(txs[0])
	if got, want := tr.Confirmed(), pglogrepl.LSN(100+n-1); got != want {
		t.Fatalf("Confirmed = %d, want %d", got, want)
	}
	if got := tr.Pending(); got != 0 {
		t.Fatalf("Pending = %d, want 0", got)
	}
}

// TestTransactionsWithoutRecordsFold: while one record waits for a broker
// that is away, a million transactions without records commit behind it.
// They are folded into one queue entry, and all are confirmed with it.
func TestTransactionsWithoutRecordsFold(t *testing.T) {
	tr := checkpoint.New(0)
	first := tr.Begin(time.Unix(1, 0))
	tr.Add(first, 1)
	tr.Commit(first, 10)
	const empty = 1_000_000
	for i := range empty {
		tx := tr.Begin(time.Unix(int64(2+i), 0))
		tr.Commit(tx, pglogrepl.LSN(20+i))
	}
	if e := tr.Entries(); e != 1 {
		t.Fatalf("%d queue entries, want 1", e)
	}
	if p := tr.Pending(); p != empty+1 {
		t.Fatalf("Pending = %d, want %d", p, empty+1)
	}
	if c, _ := tr.Oldest(); !c.Equal(time.Unix(1, 0)) {
		t.Fatalf("Oldest = %v, want the waiting transaction's", c)
	}
	if tr.Confirmed() != 0 {
		t.Fatal("confirmed past an unacked record")
	}
	tr.Ack(first)
	if c, n := tr.Confirmed(), tr.Transactions(); c != pglogrepl.LSN(20+empty-1) || n != empty+1 || tr.Pending() != 0 {
		t.Fatalf("Confirmed %d, Transactions %d, Pending %d after the ack", c, n, tr.Pending())
	}
}
