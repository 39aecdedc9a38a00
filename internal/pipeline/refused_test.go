package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
)

// refusingCluster is a fake broker that refuses, with MESSAGE_TOO_LARGE,
// every produce request holding a batch that contains marker, the way a
// broker refuses a whole batch for one record in it; it handles all other
// requests as a broker does, dead-letter records (which quote the refused
// record, marker and all, and carry a source_table header) included.
func refusingCluster(t *testing.T, marker string, topics ...string) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	c.ControlKey(int16(kmsg.Produce), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := r.(*kmsg.ProduceRequest)
		refuse := false
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				refuse = refuse || bytes.Contains(rp.Records, []byte(marker)) && !bytes.Contains(rp.Records, []byte("source_table"))
			}
		}
		if !refuse {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.MessageTooLarge.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	return c
}

// TestRefusedBatchWithFranzGo runs the pipeline on the real Kafka client
// against a fake broker that refuses any batch holding event 3. Events 1 to
// 4 of one aggregate share a batch (50 ms linger), event 5 follows in the
// next transaction. The client fails the whole partition; the pipeline
// must find event 3 by sending the refused records again one at a time,
// and publish the others once each, in order. The policy that applies is
// the outbox's own where it has one, else the stream's.
func TestRefusedBatchWithFranzGo(t *testing.T) {
	for _, tc := range []struct{ stream, outbox string }{{DeadLetter, ""}, {Fail, ""}, {Fail, DeadLetter}, {DeadLetter, Fail}} {
		policy := tc.stream
		if tc.outbox != "" {
			policy = tc.outbox
		}
		t.Run(tc.stream+"/"+tc.outbox, func(t *testing.T) {
			const topic = "outbox.event.payment"
			c := refusingCluster(t, "CULPRIT", topic, "dlq")
			ck := checkpoint.New(100)
			s, err := sink.New(sink.Config{Brokers: c.ListenAddrs(), Linger: 50 * time.Millisecond, MaxBufferedRecords: 1000},
				slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			p, err := New(Config{
				Mapping:    mapping.DefaultConfig(),
				OnBadEvent: tc.stream, OnBadEvents: []string{tc.outbox}, DeadLetterTopic: "dlq",
				MaxInflightEvents: 100, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20,
			}, ck, newFakeCatalog(), s, nil, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}

			ev := func(id int) []byte {
				payload := fmt.Sprintf(`{"seq": %d}`, id)
				if id == 3 {
					payload = `{"seq": 3, "CULPRIT": true}`
				}
				return insertMsg(fmt.Sprint(id), "payment", "agg", "E", payload, "\x00", "\x00")
			}
			if err := feed(t, p, relationMsg(), beginMsg(500), ev(1), ev(2), ev(3), ev(4), commitMsg(600), beginMsg(700), ev(5), commitMsg(800)); err != nil {
				t.Fatal(err)
			}
			// The replication goroutine's part: ask Full, as the stream does
			// before each message, until the refused records are settled.
			deadline := time.Now().Add(30 * time.Second)
			var failed error
			for failed == nil && (p.Full() || p.InFlight() > 0) {
				if time.Now().After(deadline) {
					t.Fatalf("refused records not settled after 30s: %d in flight, confirmed %s", p.InFlight(), ck.Confirmed())
				}
				select {
				case <-p.Room():
				case failed = <-p.Failed():
				case <-time.After(10 * time.Millisecond):
				}
			}

			if policy == Fail {
				if failed == nil || !strings.Contains(failed.Error(), "bad event 3 at LSN") || !strings.Contains(failed.Error(), "MESSAGE_TOO_LARGE") {
					t.Fatalf("failure %v, want it to name event 3 and the refusal", failed)
				}
				if got := consumeFake(t, c, topic, 2); fmt.Sprint(got) != "[1 2]" {
					t.Fatalf("events in the topic: %v, want [1 2] (the stream stopped at 3)", got)
				}
				return
			}
			if failed != nil {
				t.Fatal(failed)
			}
			if ck.Confirmed() != 800 {
				t.Fatalf("confirmed %s, want 800", ck.Confirmed())
			}
			if got := consumeFake(t, c, topic, 4); fmt.Sprint(got) != "[1 2 4 5]" {
				t.Fatalf("events in the topic: %v, want [1 2 4 5]", got)
			}
			if got := consumeFake(t, c, "dlq", 1); fmt.Sprint(got) != "[3]" {
				t.Fatalf("dead-letter topic: %v, want [3]", got)
			}
		})
	}
}

// consumeFake reads n records of topic from the fake cluster and returns
// their event ids.
func consumeFake(t *testing.T, c *kfake.Cluster, topic string, n int) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ids []string
	for len(ids) < n && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { ids = append(ids, eventID(r)) })
	}
	return ids
}
