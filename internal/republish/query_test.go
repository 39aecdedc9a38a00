package republish

import (
	"errors"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/pgname"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
)

func TestPlan(t *testing.T) {
	table := pgname.Name{Schema: "public", Relation: "outbox"}
	cols := func(idType uint32, createdAt bool) []column {
		c := []column{{"id", idType}, {"aggregate_type", 25}, {"aggregate_id", 25}, {"event_type", 25}, {"payload", 3802}}
		if createdAt {
			c = append(c, column{"created_at", 1184})
		}
		return c
	}
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const all = `SELECT "id", "aggregate_type", "aggregate_id", "event_type", "payload"`
	const allCA = all + `, "created_at"`
	for _, c := range []struct {
		name         string
		sel          Selection
		cols         []column
		first, next  string
		bounds       []string
		err          error
		resumeAfter1 string
	}{
		{name: "whole table", cols: cols(20, true),
			first:        allCA + ` FROM "public"."outbox" ORDER BY "id" LIMIT 10`,
			next:         allCA + ` FROM "public"."outbox" WHERE ("id") > ($1) ORDER BY "id" LIMIT 10`,
			resumeAfter1: "--after-id 7"},
		{name: "id range", sel: Selection{AfterID: "5", UntilID: "90"}, cols: cols(20, false),
			first:  all + ` FROM "public"."outbox" WHERE "id" > $1 AND "id" <= $2 ORDER BY "id" LIMIT 10`,
			next:   all + ` FROM "public"."outbox" WHERE ("id") > ($1) AND "id" > $2 AND "id" <= $3 ORDER BY "id" LIMIT 10`,
			bounds: []string{"5", "90"}, resumeAfter1: "--after-id 7"},
		{name: "by time, uuid ids", sel: Selection{Since: since}, cols: cols(2950, true),
			first:  allCA + ` FROM "public"."outbox" WHERE "created_at" >= $1 ORDER BY "created_at", "id" LIMIT 10`,
			next:   allCA + ` FROM "public"."outbox" WHERE ("created_at", "id") > ($1, $2) AND "created_at" >= $3 ORDER BY "created_at", "id" LIMIT 10`,
			bounds: []string{"2026-01-02T03:04:05Z"}, resumeAfter1: "--since '7'"},
		{name: "id bounds on uuid ids", sel: Selection{AfterID: "5"}, cols: cols(2950, true), err: ErrNotOrdered},
		{name: "time bounds without created_at", sel: Selection{Until: since}, cols: cols(20, false), err: ErrNoCreatedAt},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := New(Config{Mapping: mapping.DefaultConfig(), OnBadEvent: pipeline.Fail, Select: c.sel, BatchSize: 10, MaxInflight: 1, MaxRecordBytes: 1024})
			if err != nil {
				t.Fatal(err)
			}
			q, err := r.plan(table, c.cols)
			if !errors.Is(err, c.err) || (c.err != nil) != (err != nil) {
				t.Fatalf("err = %v, want %v", err, c.err)
			}
			if err != nil {
				return
			}
			if q.page(nil) != c.first || q.page([]string{"x"}) != c.next {
				t.Errorf("first page:\n%s\nwant\n%s\nnext pages:\n%s\nwant\n%s", q.page(nil), c.first, q.page([]string{"x"}), c.next)
			}
			var bounds []string
			for _, b := range q.bounds {
				bounds = append(bounds, string(b))
			}
			if len(bounds) != len(c.bounds) || (len(bounds) > 0 && bounds[0] != c.bounds[0]) {
				t.Errorf("bounds %q, want %q", bounds, c.bounds)
			}
			if got := q.resume([]string{"7", "8"}); got != c.resumeAfter1 {
				t.Errorf("resume = %q, want %q", got, c.resumeAfter1)
			}
		})
	}
}
