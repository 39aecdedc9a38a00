package pipeline

import "slices"

// Records the broker refuses for something about the record itself
// (recordRefused: too large, a timestamp out of its range, an invalid topic)
// are bad events. The broker refuses a whole batch, though, and franz-go
// then fails every record buffered for that partition with the same error:
// the one at fault and its innocent neighbours, which may include later
// events of the same aggregates. Which one is at fault, and the order of
// the rest, are settled here:
//
//  1. Each refused record joins refusedQ, in promise order (per partition
//     the order it was produced in), and reading pauses: Full is true
//     while any is left.
//  2. Once everything else in flight has settled (acknowledged, or
//     refused and queued), the replication goroutine sends the first
//     queued record on its own, and the next only after the broker
//     answered for it. A record refused on its own is the one at fault:
//     under fail the stream stops naming it, under dead-letter its
//     dead-letter record is sent, again alone, before the next. Its
//     neighbours simply go through.
//  3. When the queue is empty, reading resumes.
//
// Every later event of an aggregate was produced after the refused ones and
// is either in the queue behind them or not yet read, so per-aggregate
// order holds. One window remains, inside franz-go: a record produced
// after the client failed the partition and before the refusal reached
// this callback (a few milliseconds at most: its batch waits for a new
// producer epoch and the linger) is not failed with the rest and may reach
// the broker first. That cannot be undone; ackedWhileIsolating reports it.

// refused queues a record the broker refused in a batch, or applies the
// policy to one refused on its own. It runs on the client's promise
// goroutine, so it only records and wakes the replication goroutine.
func (p *Pipeline) refused(pd *pending, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.wake()
	if pd != p.alone {
		p.refusedQ = append(p.refusedQ, pd)
		p.isolating.Store(true)
		return
	}
	// Refused on its own: this is the record at fault.
	p.alone = nil
	id := eventID(&pd.rec)
	if p.policy(pd.outbox) == Fail {
		p.obs.Bad("failed", pd.kind())
		pd.countFailed()
		p.fail(&BadEventError{EventID: id, LSN: pd.lsn, Err: &RefusedError{Topic: pd.rec.Topic, Err: err}})
		return
	}
	before := pd.size
	p.refusedRecordToDeadLetter(pd, err)
	p.inflightBytes.Add(pd.size - before)
	p.next = pd
}

// isolate is Full while isolating: it produces the next record to send
// alone when its turn has come, and reports whether reading must still
// pause. It runs on the replication goroutine, the only one that produces.
func (p *Pipeline) isolate() bool {
	p.mu.Lock()
	pd := p.next
	switch {
	case pd != nil:
		p.next = nil
	case p.alone != nil:
		// Wait for the broker's answer about it.
	case len(p.refusedQ) == 0:
		p.isolating.Store(false)
		p.mu.Unlock()
		return p.Full()
	case p.inflight.Load() > int64(len(p.refusedQ)):
		// Wait until everything else in flight has settled: what is
		// still unanswered may be refused too, and must join the queue
		// first.
	default:
		pd = p.refusedQ[0]
		p.refusedQ[0] = nil
		p.refusedQ = p.refusedQ[1:]
	}
	if pd != nil {
		p.alone = pd
	}
	p.mu.Unlock()
	if pd != nil {
		// Outside the lock: the client may call Ack before Produce
		// returns.
		p.sink.Produce(&pd.rec, p.promise)
	}
	return true
}

// ackedWhileIsolating reports a record that reached the broker ahead of an
// earlier refused record of the same aggregate (the window in franz-go
// described above): a consumer sees those two events out of order.
func (p *Pipeline) ackedWhileIsolating(pd *pending) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pd == p.alone {
		p.alone = nil
		return
	}
	earlier := func(q *pending) bool {
		return q != nil && q.seq < pd.seq && q.rec.Topic == pd.rec.Topic && string(q.rec.Key) == string(pd.rec.Key)
	}
	i := slices.IndexFunc(p.refusedQ, earlier)
	if i < 0 && !earlier(p.alone) {
		return
	}
	q := p.alone
	if i >= 0 {
		q = p.refusedQ[i]
	}
	p.log.Error("per-aggregate order not kept: an event reached Kafka before an earlier event of its aggregate that the broker refused in a batch and that is sent again",
		"event_id", eventID(&pd.rec), "lsn", pd.lsn, "earlier_event_id", eventID(&q.rec), "earlier_lsn", q.lsn, "topic", pd.rec.Topic, "key", string(pd.rec.Key))
}
