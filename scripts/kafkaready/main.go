// Command kafkaready waits until a Kafka broker answers a metadata request.
// scripts/kafka.sh uses it so that "started" means "serving", not "a process
// exists".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated bootstrap brokers")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var last error
	for {
		if last = ping(ctx, strings.Split(*brokers, ",")); last == nil {
			return
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "kafkaready: %s not ready after %s: %v\n", *brokers, *timeout, last)
			os.Exit(1)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func ping(ctx context.Context, brokers []string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := kadm.NewClient(cl).BrokerMetadata(ctx)
	if err != nil {
		return err
	}
	if len(m.Brokers) == 0 {
		return fmt.Errorf("metadata lists no brokers")
	}
	if m.Controller < 0 {
		return fmt.Errorf("no active controller yet")
	}
	return nil
}
