package pipeline

import (
	"log/slog"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/shard"
)

// TestShardsKeepTheirOwnMessages: every slot decodes every message, so
// each of 4 shards keeps those whose aggregate id hashes to it (as the row
// filter hashes rows) and counts the others: each message is published by
// one shard. One whose aggregate id cannot be read is shard 0's, a bad
// event once.
func TestShardsKeepTheirOwnMessages(t *testing.T) {
	const n = 40
	msgs := [][]byte{relationMsg(), beginMsg(500)}
	for i := range n {
		msgs = append(msgs, logicalMsg(true, uint64(510+i), "cdc_outbox", envelope(string(rune('a'+i%26))+string(rune('0'+i/26)), "order")))
	}
	bad := logicalMsg(true, 590, "cdc_outbox", `{"v":1,"id":"bad","aggregate_id":7}`)
	msgs = append(msgs, bad, commitMsg(600))
	published := map[string]int{}
	for _, sh := range shard.All(4) {
		s := &fakeSink{t: t}
		p, err := New(Config{
			Mapping:    mapping.DefaultConfig(),
			OnBadEvent: DeadLetter, DeadLetterTopic: "dlq", MessagePrefix: "cdc_outbox",
			MaxInflightEvents: 100, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20,
			Shard: sh,
		}, checkpoint.New(100), newFakeCatalog(), s, nil, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if err := feed(t, p, msgs...); err != nil {
			t.Fatal(err)
		}
		kept := 0
		for _, r := range s.records {
			if r.Topic == "dlq" {
				if sh.Index != 0 {
					t.Errorf("shard %s dead-lettered %s, which is shard 0's", sh, eventID(r))
				}
				published["bad"]++
				continue
			}
			if got := shard.Of(string(r.Key), 4); got != sh.Index {
				t.Errorf("shard %s published aggregate %s, which is shard %d's", sh, r.Key, got)
			}
			published[eventID(r)]++
			kept++
		}
		others := n + 1 - len(s.records)
		if int(p.OtherShard()) != others {
			t.Errorf("shard %s: %d messages counted as another shard's, want %d", sh, p.OtherShard(), others)
		}
		if kept == 0 {
			t.Errorf("shard %s kept none of %d messages", sh, n)
		}
	}
	if len(published) != n+1 {
		t.Errorf("%d of %d messages published", len(published), n+1)
	}
	for id, c := range published {
		if c != 1 {
			t.Errorf("message %s published %d times", id, c)
		}
	}
}
