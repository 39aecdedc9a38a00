package republish

import (
	"context"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
)

// TestResumeOnlyPastAcknowledged: acknowledgements come in any order
// (partitions), but the resume point moves past a batch only when it and
// every batch before it are wholly acknowledged, and never past a record
// the broker refused.
func TestResumeOnlyPastAcknowledged(t *testing.T) {
	r, err := New(Config{Mapping: mapping.DefaultConfig(), OnBadEvent: pipeline.Fail, BatchSize: 2, MaxInflight: 10, MaxRecordBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	b1 := &batch{read: true, pending: 2, resume: "--after-id 2"}
	b2 := &batch{read: true, pending: 1, resume: "--after-id 3"}
	b3 := &batch{read: true, pending: 1, resume: "--after-id 4"}
	r.batches = []*batch{b1, b2, b3}
	rec := func(b *batch, id string) *kgo.Record {
		r.room <- struct{}{} // taken when it was sent
		return &kgo.Record{Context: &pending{Context: context.Background(), b: b, id: id}}
	}
	steps := []struct {
		rec    *kgo.Record
		err    error
		resume string
	}{
		{rec(b2, "3"), nil, ""},
		{rec(b1, "1"), nil, ""},
		{rec(b1, "2"), nil, "--after-id 3"}, // b1 and b2 done
		{rec(b3, "4"), errors.New("refused"), "--after-id 3"},
	}
	for i, s := range steps {
		r.Ack(s.rec, s.err)
		if r.sum.Resume != s.resume {
			t.Fatalf("after ack %d: resume %q, want %q", i, r.sum.Resume, s.resume)
		}
	}
	if !errors.Is(r.failed, ErrRefused) || r.sum.Acked != 3 {
		t.Fatalf("failed = %v, acked = %d; want ErrRefused and 3", r.failed, r.sum.Acked)
	}
}
