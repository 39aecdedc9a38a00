// Command demo is the viewer half of `make demo`: it prints the outbox
// events arriving in Kafka, decoded, and then the streamer's lag figures
// from its /metrics endpoint.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "Kafka bootstrap brokers")
	metrics := flag.String("metrics", "", "URL of the streamer's /metrics")
	since := flag.Int64("since", time.Now().UnixMilli(), "show records with timestamps from this unix time in milliseconds")
	count := flag.Int("count", 0, "stop after this many records")
	timeout := flag.Duration("timeout", time.Minute, "give up waiting after this long")
	flag.Parse()

	if err := show(*brokers, *since, *count, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	if *metrics != "" {
		if err := lag(*metrics); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
	}
}

func show(brokers string, since int64, count int, timeout time.Duration) error {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(brokers, ",")...),
		kgo.ConsumeRegex(),
		kgo.ConsumeTopics(`^outbox\.event\..*`),
		kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(since)),
		kgo.MetadataMinAge(250*time.Millisecond),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for seen := 0; seen < count; {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("saw %d of %d events within %s", seen, count, timeout)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			seen++
			var hs []string
			for _, h := range r.Headers {
				hs = append(hs, h.Key+"="+string(h.Value))
			}
			fmt.Printf("  %s [partition %d, offset %d]  key=%s\n    headers: %s\n    value:   %s\n",
				r.Topic, r.Partition, r.Offset, r.Key, strings.Join(hs, "  "), r.Value)
		})
	}
	return nil
}

// lag prints the metrics a person watches: how many, how far behind, how
// much WAL the slot holds.
func lag(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	want := []string{"cdc_outbox_events_total", "cdc_outbox_lag_seconds", "cdc_outbox_replication_lag_bytes",
		"cdc_outbox_confirmed_lsn", "cdc_outbox_inflight_events", "cdc_outbox_slot_retained_wal_bytes", "cdc_outbox_ready"}
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		for _, w := range want {
			if strings.HasPrefix(line, w+" ") || strings.HasPrefix(line, w+"{") {
				// An LSN reads better the way PostgreSQL prints it, and a
				// byte count in bytes and binary units than as the
				// exposition format's float (8.47691872e+08).
				fields := strings.Fields(line)
				v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
				switch {
				case err != nil:
				case w == "cdc_outbox_confirmed_lsn":
					line = fmt.Sprintf("%s %X/%X", w, uint64(v)>>32, uint64(v)&0xffffffff)
				case strings.HasSuffix(w, "_bytes"):
					line = fmt.Sprintf("%s %d (%s)", strings.Join(fields[:len(fields)-1], " "), int64(v), humanBytes(int64(v)))
				}
				lines = append(lines, "  "+line)
			}
		}
	}
	sort.Strings(lines)
	fmt.Printf("\nFrom %s:\n%s\n", url, strings.Join(lines, "\n"))
	return sc.Err()
}

// humanBytes is n in binary units with one decimal: 512 B, 1.5 KiB, 808.4 MiB.
func humanBytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, units := float64(n)/1024, []string{"KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}
