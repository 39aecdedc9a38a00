package e2e

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// TestExactlyOnceTwoClustersDefaultNames: two clusters, each with the
// default slot name, stream in exactly-once delivery into one Kafka cluster
// and one checkpoint topic (the default) while writers commit and each
// streamer is SIGKILLed and started again, in turn, four times. The default
// transactional ids and checkpoint keys derive from each stream's identity,
// so neither instance fences the other, neither takes the other's
// checkpoint for its own, and a read_committed consumer finds every event of
// each exactly once.
func TestExactlyOnceTwoClustersDefaultNames(t *testing.T) {
	t.Parallel()
	const cycles, perWriter = 4, 1500
	ctx := testenv.Context(t)
	type side struct {
		e   *env
		wl  *workload
		s   *streamer
		all []*streamer
	}
	var sides [2]*side
	for i := range sides {
		e := newEnvAt(t, testenv.Cluster(t, testenv.ClusterOptions{}).URL)
		e.slot = "cdc_outbox" // the default, on both
		sides[i] = &side{e: e, wl: newWorkload(e)}
	}
	for _, sd := range sides {
		sd.s = sd.e.eo("--max-inflight-events", "2000")
		sd.all = append(sd.all, sd.s)
		sd.e.waitStreaming()
	}
	var waits []func()
	for _, sd := range sides {
		waits = append(waits, sd.wl.writeConcurrently(t, ctx, perWriter, 1, 10))
	}
	rng := rand.New(rand.NewPCG(24, 2))
	for cycle := 1; cycle <= cycles; cycle++ {
		for i, sd := range sides {
			eventually(t, 2*time.Minute, "the writers to progress", func() bool { return sd.wl.written() >= cycle*2*perWriter/(cycles+1) })
			time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond) // the kill's moment, not a wait for a condition
			select {
			case err := <-sd.s.done:
				t.Fatalf("cluster %d's streamer stopped by itself (%v): %s", i+1, err, stoppedWith(sd.s))
			default:
			}
			sd.s.kill()
			sd.s = sd.e.eo("--max-inflight-events", "2000")
			sd.all = append(sd.all, sd.s)
		}
	}
	for _, wait := range waits {
		wait()
	}
	ids := map[string]bool{}
	for i, sd := range sides {
		sd.wl.checkExactlyOnce([]string{"payment"}, fmt.Sprintf("of cluster %d, after %d SIGKILLs of each cluster's streamer", i+1, cycles))
		sd.s.stop()
		for _, s := range sd.all {
			if log := s.logText(); strings.Contains(log, "fenced") {
				t.Fatalf("cluster %d's streamer was fenced:\n%s", i+1, tailOf(log, 3000))
			}
			for _, m := range transactionalIDLine.FindAllStringSubmatch(s.logText(), -1) {
				ids[m[1]] = true
			}
		}
	}
	t.Logf("transactional ids: %v", ids)
	if len(ids) != 2 {
		t.Fatalf("transactional ids %v: want one per cluster", ids)
	}
}

var transactionalIDLine = regexp.MustCompile(`"transactional_id":"([^"]+)"`)

// TestExactlyOnceSlowCheckpointRead: the restart after a SIGKILL behind
// the Kafka checkpoint reads that checkpoint through a proxy that holds
// every fetch request 6 s (a broker slow to answer, as just after its
// restart), longer than any one poll used to wait before taking silence
// for "no checkpoint". The restart still finds the checkpoint and skips
// what Kafka holds: nothing is sent again.
//
// Not parallel: the proxy listens on the broker's one PROXIED address.
func TestExactlyOnceSlowCheckpointRead(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	wl.killBehindCheckpoint(ctx)
	want := e.kafkaCheckpoint()
	const fetchAPI, delay = 1, 6 * time.Second
	kafkaProxy(t, e).DelayKafka(fetchAPI, delay)
	started := time.Now()
	s := e.eo()
	eventually(t, 2*time.Minute, "the restart to skip the transactions Kafka holds", func() bool {
		return strings.Contains(s.logText(), skippingMsg)
	})
	t.Logf("the restart read checkpoint %s through fetches delayed %s and skipped up to it %s after its start", want.LSN, delay, time.Since(started).Round(time.Millisecond))
	if !strings.Contains(s.logText(), fmt.Sprintf(`"checkpoint_lsn":%d,`, uint64(want.LSN))) {
		t.Fatalf("the restart did not read checkpoint %s:\n%s", want.LSN, tailOf(s.logText(), 3000))
	}
	if err := wl.write(ctx, 9, 100, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.checkExactlyOnce([]string{"payment"}, fmt.Sprintf("after a restart whose checkpoint read waited %s per fetch", delay))
	s.stop()
}

// TestExactlyOnceFormerDefaultKey: an upgrade from the former default
// names, whose checkpoint has the slot's name as key and the outbox
// table's identity as origin. The streamer is killed behind its Kafka
// checkpoint; the checkpoint is written again as the former version wrote
// it, alone in a checkpoint topic of its own; the restart on that topic
// reads it, skips what Kafka holds, and from its next commit writes under
// the stream's identity.
func TestExactlyOnceFormerDefaultKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	wl.killBehindCheckpoint(ctx)
	cp := e.kafkaCheckpoint()
	table, err := replication.TableIdentity(ctx, e.url, pgname.Name{Schema: "public", Relation: "outbox"})
	if err != nil {
		t.Fatal(err)
	}
	former := testenv.Name("checkpoints")
	cfg := sink.Config{Brokers: e.brokers}
	if err := sink.EnsureCheckpointTopic(ctx, cfg, former); err != nil {
		t.Fatal(err)
	}
	cl := testenv.KafkaClient(t, kgo.TransactionalID(testenv.Name("former")))
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, sink.CheckpointRecord(former, e.slot, table, cp.LSN)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}

	s := e.eo("--checkpoint-topic", former)
	eventually(t, time.Minute, "the restart to skip the transactions Kafka holds", func() bool {
		return strings.Contains(s.logText(), skippingMsg)
	})
	if !strings.Contains(s.logText(), "read the checkpoint written under the slot's name, the former default key") {
		t.Fatalf("the restart does not say it read the former key:\n%s", tailOf(s.logText(), 3000))
	}
	if err := wl.write(ctx, 9, 100, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.checkExactlyOnce([]string{"payment"}, "after a restart on the checkpoint of the former default key")
	eventually(t, time.Minute, "the last Kafka transaction", func() bool { return metricValue(t, s, "cdc_outbox_inflight_events") == 0 })
	s.stop()
	stream, err := replication.StreamIdentity(ctx, e.url, e.slot)
	if err != nil {
		t.Fatal(err)
	}
	now, err := sink.ReadCheckpoint(ctx, cfg, former, stream, stream)
	if err != nil || !now.Found || now.LSN <= cp.LSN {
		t.Fatalf("checkpoint under the stream's identity %s: %+v, %v; want one past %s", stream, now, err, cp.LSN)
	}
}
