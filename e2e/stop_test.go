package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestExactlyOnceStopsCleanlyUnderLoad: SIGTERM while writers commit about
// 1,000 events a second, in exactly-once delivery. The streamer stops
// reading, commits the whole transactions it queued (the Kafka transaction
// in progress included), confirms them and exits 0 within 5 s, far inside
// the default --shutdown-timeout of 30 s; it leaves no Kafka transaction
// open, so the last stable offset of the topic and of the checkpoint topic
// reaches their end at once (an open transaction would hold it back until
// the broker's transaction timeout); and a restart delivers the rest, each
// event once to a read_committed consumer.
func TestExactlyOnceStopsCleanlyUnderLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	s := e.eo()
	e.waitStreaming()
	wl.prime(ctx)
	stopWriters := wl.steady(ctx, 10*time.Millisecond)
	defer stopWriters()
	began, from := time.Now(), wl.written()
	wl.progress(t, 3000)
	rate := float64(wl.written()-from) / time.Since(began).Seconds()

	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	select {
	case err := <-s.done:
		if err != nil {
			s.dump()
			t.Fatalf("the streamer exited with %v after SIGTERM", err)
		}
	case <-time.After(5 * time.Second):
		s.dump()
		t.Fatalf("the streamer still runs 5 s after SIGTERM at %.0f events/s", rate)
	}
	took := time.Since(signalled)
	if strings.Contains(s.logText(), "shutdown timeout") {
		t.Fatalf("the drain timed out:\n%s", tailOf(s.logText(), 3000))
	}
	stopWriters()

	// Transaction markers are written just after the commit's answer: give
	// them a moment, far below the transaction timeout an open transaction
	// would wait for.
	adm := kadm.NewClient(testenv.KafkaClient(t))
	var lag string
	stable := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		topics := []string{e.topic("payment"), "cdc_outbox.checkpoints"}
		ends, err := adm.ListEndOffsets(ctx, topics...)
		if err != nil || ends.Error() != nil {
			lag = fmt.Sprintf("end offsets: %v %v", err, ends.Error())
			return false
		}
		lsos, err := adm.ListCommittedOffsets(ctx, topics...)
		if err != nil || lsos.Error() != nil {
			lag = fmt.Sprintf("last stable offsets: %v %v", err, lsos.Error())
			return false
		}
		lag = ""
		ends.Each(func(o kadm.ListedOffset) {
			if l, ok := lsos.Lookup(o.Topic, o.Partition); !ok || l.Offset != o.Offset {
				lag += fmt.Sprintf("%s[%d]: end %d, last stable %d; ", o.Topic, o.Partition, o.Offset, l.Offset)
			}
		})
		return lag == ""
	}
	deadline := time.Now().Add(2 * time.Second)
	for !stable() {
		if time.Now().After(deadline) {
			t.Fatalf("a Kafka transaction was left open: %s", lag)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("SIGTERM at %.0f events/s: exited 0 after %s; no Kafka transaction left open", rate, took.Round(time.Millisecond))

	s = e.eo()
	wl.checkExactlyOnce([]string{"payment"}, "after a SIGTERM under load and a restart")
	s.stop()
}
