package relay

// The simulation's invariants (docs/architecture.md), checked after every
// step and, for what must be true once everything is streamed, at the end.

import (
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
)

// held indexes what Kafka holds, as records land.
type held struct {
	events  map[int]int       // uid → records of the event (not dead letters)
	dead    map[int]int       // uid → dead-letter records of a lone message
	deadAt  map[[2]string]int // (epoch, uid) → dead-letter records
	copies  map[[3]string]int // (source, id, uid) → records
	ids     map[[2]string]int // (source, id) → the uid of the first record
	initted bool
}

func (h *held) init() {
	if !h.initted {
		h.events, h.dead, h.deadAt, h.copies, h.ids, h.initted = map[int]int{}, map[int]int{}, map[[2]string]int{}, map[[3]string]int{}, map[[2]string]int{}, true
	}
}

// add indexes a record that landed and checks at once what a record may
// break: no event of a new history shares (source, id) with an event of a
// lost one (their content differs); exactly-once delivery publishes each
// event once for read_committed readers, and a lone message's dead letter
// once.
func (w *world) add(l landed) {
	h := &w.kafka.held
	h.init()
	if l.dlq {
		h.dead[l.uid]++
		// Under a new epoch's source a repeat is by design: an epoch that
		// begins at 0 publishes the shared part of the histories again.
		d := [2]string{strconv.Itoa(l.epoch), strconv.Itoa(l.uid)}
		h.deadAt[d]++
		if w.exactly && h.deadAt[d] > 1 && !w.repeatsOK[l.uid] {
			w.fail("exactly-once: the dead letter of lone message %s (content %d) is in Kafka %d times in epoch %d (%s wrote the last)", l.id, l.uid, h.deadAt[d], l.epoch, l.by)
		}
		return
	}
	h.events[l.uid]++
	si := [2]string{l.source, l.id}
	if first, ok := h.ids[si]; !ok {
		h.ids[si] = l.uid
	} else if first != l.uid {
		w.fail("source %s, id %s: an event (content %d, from %s) shares its source and id with another event (content %d) of a lost history", l.source, l.id, l.uid, l.by, first)
	}
	c := [3]string{l.source, l.id, strconv.Itoa(l.uid)}
	h.copies[c]++
	if w.exactly && h.copies[c] > 1 && !w.repeatsOK[l.uid] {
		w.fail("exactly-once: event source %s, id %s (content %d) is in Kafka %d times for read_committed readers (%s wrote the last)", l.source, l.id, l.uid, h.copies[c], l.by)
	}
}

// check runs after every step: a process's confirmed position never goes
// back; the slot's position, and a streaming process's confirmed position,
// never pass an event of the server's history that Kafka does not hold.
func (w *world) check() {
	for _, p := range w.procs {
		c := p.tracker.Confirmed()
		if c < p.confirmed {
			w.fail("%s: the confirmed position went back from %s to %s", p.name, p.confirmed, c)
		}
		p.confirmed = c
		if p.conn != nil {
			w.inKafkaUpTo(c, p.name+"'s confirmed position")
		}
	}
	w.inKafkaUpTo(w.srv.slot, "the slot's confirmed_flush_lsn")
}

// inKafkaUpTo: every event of the server's history in a transaction that
// ended at or before pos is in Kafka, and the dead letter of every lone
// message there.
func (w *world) inKafkaUpTo(pos pglogrepl.LSN, what string) {
	w.inKafka(func(it *item) bool { return it.end <= pos }, fmt.Sprintf("%s %s", what, pos))
}

// checkFinal: after the drain, every event of the server's history is in
// Kafka.
func (w *world) checkFinal() {
	w.inKafka(func(*item) bool { return true }, "the end")
}

func (w *world) inKafka(upTo func(*item) bool, what string) {
	h := &w.kafka.held
	h.init()
	for _, it := range w.srv.wal {
		if !upTo(it) {
			return
		}
		for _, e := range it.events {
			switch {
			case e.kind == evOther:
			case e.foreign && h.events[e.uid]+h.dead[e.uid] > 0:
				w.fail("published: message %d at %s (content %d) is another shard's (%s streams %s)", e.id, e.lsn, e.uid, w.shard, messageAggregate(e.uid))
			case e.foreign:
			case e.kind == evLone && h.dead[e.uid] == 0:
				w.fail("lost: lone message l-%d at %s (content %d) has no dead letter in Kafka, and %s is past it", e.id, e.lsn, e.uid, what)
			case e.kind != evLone && h.events[e.uid] == 0:
				w.fail("lost: event id %d at %s of transaction %d ending at %s (content %d) is not in Kafka, and %s is past it", e.id, e.lsn, it.xid, it.end, e.uid, what)
			}
		}
	}
}
