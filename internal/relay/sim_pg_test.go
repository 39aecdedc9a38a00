package relay

// The simulation's PostgreSQL: a WAL history of transactions and lone
// messages on a timeline, a slot, and a walsender that sends pgoutput v1
// from the later of the asked position and the slot's.

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pglogrepl"
)

// event is a change of a transaction: an outbox row, an outbox message
// (transactional), a row of another table; or a lone message.
type event struct {
	kind  int
	table int   // rows: 1 to 3 (the relation id); 100 another table
	id    int64 // rows: the table's bigserial; messages: the message sequence
	uid   int   // unique across histories: in the payload
	lsn   pglogrepl.LSN
	// foreign: a message of another shard's aggregate (world.shard),
	// which every slot decodes and this stream must pass over.
	foreign bool
}

const (
	evRow = iota
	evMsg
	evOther
	evLone
)

// item is a committed transaction, or a lone message (one event at end).
type item struct {
	lone       bool
	xid        uint32
	commitTime time.Time
	begin      pglogrepl.LSN // where the transaction's WAL begins
	final, end pglogrepl.LSN // the commit record's start and end; a lone message: end is its position
	events     []event
	// The sequences after it: a copy of the server taken up to here has
	// them.
	ids    [4]int64
	msgID  int64
	xidEnd uint32
}

type server struct {
	w       *world
	sys     string
	addr    string
	tl      int32
	ends    map[int32]pglogrepl.LSN
	wal     []*item
	flushed pglogrepl.LSN // where the WAL ends: the last item's end, or later
	slot    pglogrepl.LSN // confirmed_flush_lsn
	ids     [4]int64
	msgID   int64
	xid     uint32
	n       int // servers made, for addresses
	base    int // the items of the WAL before this timeline began
	// prepared is a transaction prepared for two-phase commit (PREPARE
	// TRANSACTION) and not committed yet: its changes are in the WAL
	// before the commits that come meanwhile, its commit (COMMIT
	// PREPARED) comes later, and pgoutput v1 sends it then, whole, as any
	// transaction.
	prepared *item
}

var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func newServer(w *world) *server {
	return &server{w: w, sys: "7000", addr: "pg1", tl: 1, ends: map[int32]pglogrepl.LSN{}, flushed: 0x1000000, slot: 0x1000000, xid: 700, n: 1}
}

func (s *server) endsCopy() map[int32]pglogrepl.LSN {
	m := make(map[int32]pglogrepl.LSN, len(s.ends))
	for k, v := range s.ends {
		m[k] = v
	}
	return m
}

// end is where the last item ends.
func (s *server) end() pglogrepl.LSN {
	if len(s.wal) == 0 {
		return 0
	}
	return s.wal[len(s.wal)-1].end
}

// write commits a transaction (outbox rows, messages, other rows; now and
// then a big one) or emits a lone message, at the end of the WAL.
func (s *server) write() {
	rng := s.w.rng
	at := s.flushed + pglogrepl.LSN(8*rng.IntN(3)) // other WAL before it
	if it := s.prepared; it != nil && rng.IntN(4) == 0 {
		s.commitPrepared(it, at)
		return
	}
	s.xid++
	it := &item{xid: s.xid, begin: at}
	// Commit times go forward on one history but are new on each: two
	// histories never share one to the microsecond.
	s.w.uid++
	it.commitTime = pgEpoch.Add(time.Duration(900_000_000+s.w.uid) * time.Second).Add(time.Duration(rng.IntN(1_000_000)) * time.Microsecond)
	r := rng.IntN(20)
	if r == 4 && s.prepared == nil {
		// Two-phase commit: the changes now, the commit later.
		s.prepareTransaction(it, at)
		return
	}
	switch {
	case r < 2:
		it.lone = true
		s.msgID++
		s.w.uid++
		it.end = at + 16
		it.events = []event{{kind: evLone, id: s.msgID, uid: s.w.uid, lsn: it.end, foreign: s.w.foreign(s.w.uid)}}
	default:
		n := 1 + rng.IntN(4)
		if r == 2 {
			n = 20 + rng.IntN(40) // a big one, likely cut mid-way
		}
		lsn := s.changes(it, at, n, r == 3)
		it.final = lsn + 16
		it.end = it.final + 8
	}
	s.commit(it)
}

// changes are a transaction's n changes from at on: rows of the outbox
// tables (their ids from the tables' bigserials), transactional messages,
// rows of another table; only other rows when other is set. It returns
// where the last one lies.
func (s *server) changes(it *item, at pglogrepl.LSN, n int, other bool) pglogrepl.LSN {
	rng := s.w.rng
	lsn := at
	for range n {
		if rng.IntN(3) != 0 || lsn == at {
			lsn += 16 // rows of one multi-row INSERT share an LSN otherwise
		}
		s.w.uid++
		e := event{uid: s.w.uid, lsn: lsn}
		switch k := rng.IntN(10); {
		case other || k == 0:
			e.kind, e.table = evOther, 100
		case k == 1:
			s.msgID++
			e.kind, e.id, e.foreign = evMsg, s.msgID, s.w.foreign(e.uid)
		default:
			e.kind, e.table = evRow, 1+rng.IntN(s.w.tables)
			s.ids[e.table]++
			e.id = s.ids[e.table]
		}
		it.events = append(it.events, e)
	}
	return lsn
}

// prepareTransaction writes a transaction's changes and its PREPARE
// record, and keeps it prepared.
func (s *server) prepareTransaction(it *item, at pglogrepl.LSN) {
	last := s.changes(it, at, 1+s.w.rng.IntN(4), false)
	s.flushed = last + 16 // the PREPARE record
	s.prepared = it
	s.w.logf("%s prepares transaction %d of %d changes up to %s", s.addr, it.xid, len(it.events), s.flushed)
}

// commitPrepared writes COMMIT PREPARED of the prepared transaction at at,
// after the transactions committed since it was prepared.
func (s *server) commitPrepared(it *item, at pglogrepl.LSN) {
	s.prepared = nil
	s.w.uid++
	it.commitTime = pgEpoch.Add(time.Duration(900_000_000+s.w.uid) * time.Second).Add(time.Duration(s.w.rng.IntN(1_000_000)) * time.Microsecond)
	it.final = at + 16
	it.end = it.final + 8
	s.w.logf("%s commits prepared transaction %d, prepared at %s", s.addr, it.xid, it.begin)
	s.commit(it)
}

// commit puts a committed transaction (or a lone message) at the end of
// the WAL.
func (s *server) commit(it *item) {
	it.ids, it.msgID, it.xidEnd = s.ids, s.msgID, s.xid
	s.wal = append(s.wal, it)
	s.flushed = it.end
	what := fmt.Sprintf("transaction %d of %d changes ending at %s", it.xid, len(it.events), it.end)
	if it.lone {
		what = fmt.Sprintf("lone message l-%d at %s", it.events[0].id, it.end)
	}
	s.w.logf("%s writes %s", s.addr, what)
}

// cut is a copy of s with the first k items of its WAL and the sequences
// as they were after them.
func (s *server) cut(k int) *server {
	c := *s
	// A transaction prepared on s is rolled back on a copy (ROLLBACK
	// PREPARED): it was never committed there.
	c.prepared = nil
	c.wal = append([]*item(nil), s.wal[:k]...)
	c.ends = s.endsCopy()
	c.ids, c.msgID = [4]int64{}, 0
	if k > 0 {
		last := s.wal[k-1]
		c.ids, c.msgID, c.xid = last.ids, last.msgID, last.xidEnd
		c.flushed = last.end
	} else {
		c.flushed = 0x1000000
	}
	return &c
}

// promote is a standby that had received the first k items, promoted: a
// new timeline forks where its WAL ends; its failover slot is the
// primary's as far as the standby had it.
func (s *server) promote(k int) *server {
	c := s.cut(k)
	c.n++
	c.addr = fmt.Sprintf("pg%d", c.n)
	c.ends[s.tl] = c.flushed
	c.tl = s.tl + 1
	c.base = k
	c.slot = min(s.slot, c.flushed)
	// A lost xid range may be handed out again: that is the hazard.
	return c
}

// restored is s put back from a copy of itself taken when its WAL ended
// after k items: the slot as the copy had it, or, when keep is false and
// everything before was confirmed, made again where the WAL ends.
func (s *server) restored(k int, keep bool) *server {
	c := s.cut(k)
	c.slot = min(s.slot, c.flushed)
	if !keep && s.slot >= c.flushed {
		c.slot = c.flushed
	}
	return c
}

// walsender is one replication connection's sending: every item that ends
// after start, whole, message by message.
type walsender struct {
	s       *server
	start   pglogrepl.LSN
	item    int // the next item to send
	msgs    []wmsg
	sentEnd pglogrepl.LSN // where the last item sent ends
	rels    map[uint32]bool
}

type wmsg struct {
	lsn  pglogrepl.LSN
	data []byte
	what string
}

// startReplication is START_REPLICATION at start (the later of the asked
// position and the slot's).
func (s *server) startReplication(start pglogrepl.LSN) *walsender {
	ws := &walsender{s: s, start: start, sentEnd: start, rels: map[uint32]bool{}}
	for ws.item < len(s.wal) && s.wal[ws.item].end <= start {
		ws.item++
	}
	return ws
}

func (ws *walsender) caughtUp() bool { return len(ws.msgs) == 0 && ws.item >= len(ws.s.wal) }

// sentTo is how far it has sent whole items.
func (ws *walsender) sentTo() pglogrepl.LSN { return ws.sentEnd }

// walEnd is a keepalive's position: how far the walsender has read, which
// while it decodes the next transaction lies anywhere before its commit.
func (ws *walsender) walEnd(rng *rand.Rand) pglogrepl.LSN {
	if len(ws.msgs) > 0 {
		return ws.sentEnd // inside a transaction being sent: the position sent before it
	}
	if ws.item >= len(ws.s.wal) {
		return max(ws.sentEnd, ws.s.flushed)
	}
	next := ws.s.wal[ws.item]
	limit := next.final // before the commit record
	if next.lone {
		limit = next.end - 1
	}
	if limit <= ws.sentEnd {
		return ws.sentEnd
	}
	return ws.sentEnd + pglogrepl.LSN(rng.IntN(int(limit-ws.sentEnd)))
}

// next is the next message; call only when not caught up.
func (ws *walsender) next() wmsg {
	if len(ws.msgs) == 0 {
		ws.msgs = ws.encode(ws.s.wal[ws.item])
		ws.item++
	}
	m := ws.msgs[0]
	ws.msgs = ws.msgs[1:]
	if len(ws.msgs) == 0 {
		ws.sentEnd = ws.s.wal[ws.item-1].end
	}
	return m
}

// encode is an item's pgoutput messages: Begin, a Relation before a
// relation's first change on this connection, the changes, Commit.
func (ws *walsender) encode(it *item) []wmsg {
	if it.lone {
		e := it.events[0]
		return []wmsg{{e.lsn, logicalMsg(false, e.lsn, envelope("l", e)), fmt.Sprintf("lone message l-%d", e.id)}}
	}
	out := []wmsg{{it.begin, beginMsg(it.final, it.commitTime, it.xid), fmt.Sprintf("begin %d", it.xid)}}
	for _, e := range it.events {
		switch e.kind {
		case evMsg:
			out = append(out, wmsg{e.lsn, logicalMsg(true, e.lsn, envelope("m", e)), "message"})
		default:
			rel := uint32(e.table)
			if !ws.rels[rel] {
				ws.rels[rel] = true
				out = append(out, wmsg{e.lsn, relationMsg(rel), "relation"})
			}
			out = append(out, wmsg{e.lsn, insertMsg(rel, e), "insert"})
		}
	}
	return append(out, wmsg{it.final, commitMsg(it.final, it.end, it.commitTime), fmt.Sprintf("commit %d", it.xid)})
}

// pgoutput v1, byte by byte (pglogrepl only parses it).

func be16(b []byte, v uint16) []byte { return binary.BigEndian.AppendUint16(b, v) }
func be32(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }
func be64(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }

func pgTime(t time.Time) uint64 { return uint64(t.Sub(pgEpoch).Microseconds()) }

func beginMsg(final pglogrepl.LSN, commitTime time.Time, xid uint32) []byte {
	return be32(be64(be64([]byte{'B'}, uint64(final)), pgTime(commitTime)), xid)
}

func commitMsg(final, end pglogrepl.LSN, commitTime time.Time) []byte {
	return be64(be64(be64([]byte{'C', 0}, uint64(final)), uint64(end)), pgTime(commitTime))
}

var outboxColumns = []struct {
	name string
	oid  uint32
}{{"id", 20}, {"aggregate_type", 25}, {"aggregate_id", 25}, {"event_type", 25}, {"payload", 3802}, {"headers", 3802}, {"created_at", 1184}}

func relationMsg(rel uint32) []byte {
	name := fmt.Sprintf("outbox%d", rel)
	cols := outboxColumns
	if rel == 100 {
		name, cols = "orders", outboxColumns[:2]
	}
	b := be32([]byte{'R'}, rel)
	b = append(b, "public\x00"+name+"\x00"...)
	b = append(b, 'd')
	b = be16(b, uint16(len(cols)))
	for _, c := range cols {
		b = append(b, 0)
		b = append(b, c.name+"\x00"...)
		b = be32(b, c.oid)
		b = be32(b, 0xffffffff)
	}
	return b
}

func insertMsg(rel uint32, e event) []byte {
	id := fmt.Sprint(e.id)
	values := []string{id, "order", "agg-" + id, "Created", fmt.Sprintf(`{"u": %d}`, e.uid), "\x00", "2026-12-01 00:00:00+00"}
	if rel == 100 {
		values = []string{fmt.Sprint(e.uid), "other"}
	}
	b := be32([]byte{'I'}, rel)
	b = append(b, 'N')
	b = be16(b, uint16(len(values)))
	for _, v := range values {
		if v == "\x00" {
			b = append(b, 'n')
			continue
		}
		b = append(b, 't')
		b = be32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}

func logicalMsg(transactional bool, lsn pglogrepl.LSN, content string) []byte {
	flags := byte(0)
	if transactional {
		flags = 1
	}
	b := be64([]byte{'M', flags}, uint64(lsn))
	b = append(b, prefix+"\x00"...)
	b = be32(b, uint32(len(content)))
	return append(b, content...)
}

// envelope is an outbox message's content (contract.Message).
func envelope(kind string, e event) string {
	return fmt.Sprintf(`{"v":1,"id":"%s-%d","aggregate_type":"order","aggregate_id":"%s","event_type":"Created","payload":{"u": %d}}`, kind, e.id, messageAggregate(e.uid), e.uid)
}

// messageAggregate is the aggregate id of the message of content uid: one
// of eight, so that a split stream's shards each have some.
func messageAggregate(uid int) string { return fmt.Sprintf("agg-%d", uid%8) }
