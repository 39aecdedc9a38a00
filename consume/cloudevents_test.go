package consume

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestCloudEventsRecordsDeduped: records in both CloudEvents modes are
// identified by their source and id attributes: a redelivered one is
// skipped, and the same id from another source is another event.
func TestCloudEventsRecordsDeduped(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	binary := func(source, id string) *kgo.Record {
		return &kgo.Record{Topic: e.topic, Key: []byte("k"), Value: []byte(`{"n": 1}`), Headers: []kgo.RecordHeader{
			{Key: "ce_specversion", Value: []byte("1.0")}, {Key: "ce_id", Value: []byte(id)}, {Key: "ce_source", Value: []byte(source)},
			{Key: "ce_type", Value: []byte("t")}, {Key: "content-type", Value: []byte("application/json")}}}
	}
	structured := func(source, id string) *kgo.Record {
		return &kgo.Record{Topic: e.topic, Key: []byte("k"),
			Value:   fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":%q,"type":"t","data":{"n":1}}`, id, source),
			Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json; charset=UTF-8")}}}
	}
	var rs []*kgo.Record
	for i := range 10 {
		id := fmt.Sprint(i)
		rs = append(rs, binary("a", id), structured("b", id), binary("a", id), structured("b", id))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := kafkaClient(t).ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	c := e.consumer(e.config(func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		ev, _ := eventKey(r)
		_, err := tx.Exec(ctx, `INSERT INTO billing (source, event_id, amount) VALUES ($1, $2, 1)`, ev.source, ev.id)
		return err
	}))
	if err := runUntil(t, c, func() bool { return int(stats(c).processed.Load())+int(stats(c).duplicates.Load()) == 40 }); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if rows, distinct := e.billing(); rows != 20 || distinct != 20 {
		t.Errorf("billing: %d rows, %d distinct events; want 20 and 20", rows, distinct)
	}
	if p, d := int(stats(c).processed.Load()), int(stats(c).duplicates.Load()); p != 20 || d != 20 {
		t.Errorf("processed=%d duplicates=%d; want 20 and 20", p, d)
	}
}
