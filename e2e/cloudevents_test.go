package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestCloudEventsRecords: with --record-format cloudevents-binary and
// cloudevents-structured, the CloudEvents Go SDK decodes and validates
// every record the streamer wrote to the real broker, and reads back each
// row: id, the default source, type, the aggregate id as subject,
// created_at as time, the payload as data with its content type (a
// content-type key of the headers column overriding it), and the other
// headers passed on.
func TestCloudEventsRecords(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"cloudevents-binary", "cloudevents-structured"} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			// Created beforehand: the first record's wait for an
			// auto-created topic is not what this test is about.
			adm := kadm.NewClient(testenv.KafkaClient(t))
			if resp, err := adm.CreateTopic(testenv.Context(t), 1, 1, nil, e.topic("order")); err != nil || resp.Err != nil {
				t.Fatalf("create topic %s: %v %v", e.topic("order"), err, resp.Err)
			}
			s := e.start("--record-format", format)
			e.waitStreaming()
			const n = 20
			ctx := testenv.Context(t)
			for i := range n {
				headers := `{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`
				if i%5 == 0 {
					headers = `{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "content-type": "application/vnd.example+json"}`
				}
				if _, err := e.pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, created_at)
					VALUES ('order', $1, 'order.created', jsonb_build_object('n', $2::int, 'text', 'a "quoted" line'||chr(10)), $3, now() - $2 * interval '1 second')`,
					fmt.Sprintf("o-%d", i%3), i, headers); err != nil {
					t.Fatal(err)
				}
			}
			type row struct {
				typ, agg, payload, contentType string
				created                        time.Time
			}
			want := map[string]row{}
			rows, err := e.pool.Query(ctx, `SELECT id::text, event_type, aggregate_id, payload::text, coalesce(headers->>'content-type', 'application/json'), created_at FROM outbox`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var id string
				var r row
				if err := rows.Scan(&id, &r.typ, &r.agg, &r.payload, &r.contentType, &r.created); err != nil {
					t.Fatal(err)
				}
				want[id] = r
			}
			if rows.Err() != nil || len(want) != n {
				t.Fatalf("read %d rows back: %v", len(want), rows.Err())
			}
			source := e.defaultSource()

			cl := testenv.KafkaClient(t, kgo.ConsumeTopics(e.topic("order")), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			seen := map[string]int{}
			got := 0
			for got < n {
				fetches := cl.PollFetches(rctx)
				if rctx.Err() != nil {
					t.Fatalf("read %d of %d records of %s within 60s", got, n, e.topic("order"))
				}
				fetches.EachRecord(func(r *kgo.Record) {
					got++
					ev, err := testenv.CloudEvent(r)
					if err != nil {
						t.Fatalf("offset %d: the CloudEvents SDK refuses the record: %v (headers %v, value %s)", r.Offset, err, r.Headers, r.Value)
					}
					w, ok := want[ev.ID()]
					if !ok {
						t.Fatalf("offset %d: event id %q is no row's", r.Offset, ev.ID())
					}
					seen[ev.ID()]++
					if ev.SpecVersion() != "1.0" || ev.Source() != source || ev.Type() != w.typ || ev.Subject() != w.agg ||
						!ev.Time().Equal(w.created) || ev.DataContentType() != w.contentType || string(ev.Data()) != w.payload ||
						ev.Extensions()["aggregatetype"] != "order" {
						t.Errorf("event %s reads as\n%s\nwant source %s, type %s, subject %s, time %s, content type %s, data %s",
							ev.ID(), ev, source, w.typ, w.agg, w.created.UTC().Format(time.RFC3339Nano), w.contentType, w.payload)
					}
					if string(r.Key) != w.agg || header(r, "traceparent") != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
						t.Errorf("event %s: key %q, traceparent %q", ev.ID(), r.Key, header(r, "traceparent"))
					}
					wantCT := w.contentType
					if format == "cloudevents-structured" {
						wantCT = "application/cloudevents+json; charset=UTF-8"
					}
					if ct := header(r, "content-type"); ct != wantCT {
						t.Errorf("event %s: content-type %q, want %q", ev.ID(), ct, wantCT)
					}
				})
			}
			if len(seen) != n {
				t.Fatalf("%d distinct events of %d", len(seen), n)
			}
			t.Logf("%s: %d records, every one decoded and validated by the CloudEvents SDK", format, got)
			s.stop()
		})
	}
}
