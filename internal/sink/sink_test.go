package sink_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestPartitionsLikeTheJavaClient produces keyed records to a 12-partition
// topic of the real broker and checks each lands where the Java client's
// default partitioner puts it. The expected partitions were computed with
// org.apache.kafka.common.utils.Utils.murmur2 from kafka-clients 4.1.1:
// (murmur2(key) & 0x7fffffff) % 12.
func TestPartitionsLikeTheJavaClient(t *testing.T) {
	t.Parallel()
	topic := testenv.Topic(t, "partitions", 12)
	want := map[string]int32{"21": 0, "foobar": 6, "payment-42": 5, "w3-a7": 6, "ünïcode": 1}

	acked := make(chan *kgo.Record, len(want))
	s, err := sink.New(sink.Config{Brokers: testenv.KafkaBrokers(t), Linger: time.Millisecond}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	promise := func(r *kgo.Record, err error) {
		if err != nil {
			t.Errorf("record %s failed: %v", r.Key, err)
		}
		acked <- r
	}
	for key := range want {
		s.Produce(&kgo.Record{Topic: topic, Key: []byte(key), Value: []byte("{}")}, promise)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for range want {
		r := <-acked
		if r.Partition != want[string(r.Key)] {
			t.Errorf("key %q went to partition %d; the Java client sends it to %d", r.Key, r.Partition, want[string(r.Key)])
		}
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("ping a reachable broker: %v", err)
	}
}

func TestUnknownCompressionIsRefused(t *testing.T) {
	_, err := sink.New(sink.Config{Brokers: []string{"127.0.0.1:1"}, Compression: "brotli"}, slog.New(slog.DiscardHandler))
	if err == nil {
		t.Fatal("brotli accepted")
	}
}

// TestPingNoticesASilentBroker: behind a proxy that stops forwarding, Ping
// fails within its context, and succeeds again once the network heals. A
// ping answered from the client's metadata cache would pass throughout.
func TestPingNoticesASilentBroker(t *testing.T) {
	t.Parallel()
	proxy := testenv.NewProxy(t, "127.0.0.1:0", testenv.KafkaBrokers(t)[0])
	// Every connection, to the seed and to the address the broker
	// advertises, goes through the proxy.
	var d net.Dialer
	through := kgo.Dialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, proxy.Addr())
	})
	s, err := sink.New(sink.Config{Brokers: []string{proxy.Addr()}, Opts: []kgo.Opt{through}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ping := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return s.Ping(ctx)
	}
	if err := ping(30 * time.Second); err != nil {
		t.Fatalf("ping a reachable broker: %v", err)
	}
	proxy.Blackhole()
	if err := ping(2 * time.Second); err == nil {
		t.Fatal("ping succeeded while the network was silent")
	}
	proxy.Restore()
	if err := ping(30 * time.Second); err != nil {
		t.Fatalf("ping after the network healed: %v", err)
	}
}
