package e2e

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// scrape reads /metrics and returns each sample line's value by its series
// (name and labels as printed).
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// TestMetricsMoveWhileEventsFlow scrapes /metrics while events flow: the
// event counter, the confirmed LSN and the lag all move, and /readyz says
// ready.
func TestMetricsMoveWhileEventsFlow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.start("--slot-poll-interval", "1s")
	e.waitStreaming()
	addr := s.httpAddr()

	eventually(t, 30*time.Second, "/readyz to answer 200", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	before := scrape(t, addr)

	// Scrape fast while the first events go to a topic that does not exist
	// yet: creating it takes the broker a moment, so lag shows.
	wl := newWorkload(e)
	done := make(chan error, 1)
	go func() { done <- wl.write(testenv.Context(t), 0, 500, 10, "payment", false) }()
	var maxLag, maxInflight float64
	topic := `cdc_outbox_events_total{kind="row",topic="` + e.topic("payment") + `"}`
	var last map[string]float64
	eventually(t, 60*time.Second, "500 events counted", func() bool {
		last = scrape(t, addr)
		maxLag = max(maxLag, last["cdc_outbox_lag_seconds"])
		maxInflight = max(maxInflight, last["cdc_outbox_inflight_events"])
		return last[topic] == 500
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("max lag seen %.3fs, max in flight %v", maxLag, maxInflight)
	if maxLag <= 0 {
		t.Errorf("cdc_outbox_lag_seconds never moved while events flowed")
	}
	eventually(t, 10*time.Second, "the confirmed LSN to move", func() bool {
		last = scrape(t, addr)
		return last["cdc_outbox_confirmed_lsn"] > before["cdc_outbox_confirmed_lsn"]
	})
	if last["cdc_outbox_end_to_end_latency_seconds_count"] < 500 || last["cdc_outbox_transactions_total"] < 50 {
		t.Errorf("latency count %v, transactions %v", last["cdc_outbox_end_to_end_latency_seconds_count"], last["cdc_outbox_transactions_total"])
	}
	eventually(t, 10*time.Second, "the slot poller", func() bool {
		last = scrape(t, addr)
		return last["cdc_outbox_slot_active"] == 1 && last[`cdc_outbox_slot_wal_status{status="reserved"}`] == 1
	})
	if last[`cdc_outbox_connected{target="postgres"}`] != 1 || last[`cdc_outbox_connected{target="kafka"}`] != 1 || last["cdc_outbox_ready"] != 1 {
		t.Errorf("connected/ready: %v %v %v", last[`cdc_outbox_connected{target="postgres"}`], last[`cdc_outbox_connected{target="kafka"}`], last["cdc_outbox_ready"])
	}
	s.stop()
}

// TestTableRecreatedIsReported: an outbox table dropped and created again
// leaves the publication, so its inserts are not streamed. The streamer
// cannot see what it is not sent; it notices from the catalog, says so in
// its log and in /readyz.
func TestTableRecreatedIsReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.start("--slot-poll-interval", "1s")
	e.waitStreaming()
	addr := s.httpAddr()
	testenv.Exec(t, e.url, `DROP TABLE outbox`)
	sql, err := os.ReadFile("../sql/publication.sql")
	if err != nil {
		t.Fatal(err)
	}
	// Recreate the table only: the publication still exists, without it.
	testenv.Exec(t, e.url, strings.Split(string(sql), "DO $$")[0])
	eventually(t, 30*time.Second, "/readyz to report the table missing from the publication", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 503 && strings.Contains(string(body), "is not in publication")
	})
	if !strings.Contains(s.logText(), "the outbox table is not in the publication") {
		t.Fatalf("no error logged:\n%s", s.logText())
	}
	s.stop()
}
