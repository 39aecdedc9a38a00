package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/examples/payments/payments"
	"github.com/cdc-outbox/cdc-outbox/examples/payments/provider"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestPaymentsExampleUnderFailure runs the whole example (examples/payments,
// its fake card provider, cdc-outbox, examples/billing) through the
// failures each piece is there to survive:
//
//   - a proxy in front of the payments service loses 30% of its responses
//     after the service handled the request, so clients retry requests that
//     did commit (idempotency middleware: replay, never a second payment);
//   - 10% of the provider's answers are lost after it charged, so the
//     payment rolls back and is retried after the charge was made (the
//     derived provider key: the same charge, never a second one);
//   - the streamer is SIGKILLed twice (at-least-once: events are re-sent);
//   - the billing consumer is SIGKILLed once mid-stream (offsets not
//     committed: records are redelivered, and skipped by processed_events).
//
// In the end each of the 1,000 payments exists once, was charged once, is
// in Kafka at least once, and has exactly one invoice.
func TestPaymentsExampleUnderFailure(t *testing.T) {
	t.Parallel()
	const (
		total       = 1000
		workers     = 8
		proxyLoss   = 0.30
		providerErr = 0.10
		// pace bounds the rate payments are started at (about 125/s), so the
		// workload lasts long enough for the kills to land while events are
		// flowing rather than after.
		pace = 8 * time.Millisecond
	)
	e := newEnv(t)
	ctx := testenv.Context(t)
	billingBin := buildBilling(t)

	// Payments' database is the test's (outbox and publication from the
	// harness); billing gets a database of its own, as it would in
	// production, so the checks below compare across the two.
	applySQLFiles(t, e.url, "../sql/idempotency.sql", "../examples/payments/schema.sql")
	billingURL := testenv.Database(t)
	applySQLFiles(t, billingURL, "../sql/processed_events.sql", "../examples/billing/schema.sql")
	billingPool, err := pgxpool.New(ctx, billingURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(billingPool.Close)

	// The topic exists before billing subscribes (no wait for the broker to
	// auto-create it and for the consumer to notice), with 3 partitions so
	// offsets are committed per partition.
	topic := e.topic("payment")
	adm := kadm.NewClient(testenv.KafkaClient(t))
	if resp, err := adm.CreateTopic(ctx, 3, 1, nil, topic); err != nil || resp.Err != nil {
		t.Fatalf("create topic %s: %v %v", topic, err, resp.Err)
	}
	t.Cleanup(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(dctx, topic)
	})

	streamer := e.start()
	e.waitStreaming()

	group := testenv.Name("billing")
	billingArgs := []string{"--postgres-url", billingURL, "--kafka-brokers", e.brokers[0], "--topic", topic,
		"--group", group, "--http-addr", "127.0.0.1:0",
		// Static membership: the restarted consumer takes over the killed
		// one's partitions at once, instead of after the session timeout.
		"--instance-id", "billing-0"}
	billing := startBilling(t, billingBin, billingArgs...)

	// The provider, behind a wrapper that loses some of its answers after it
	// has charged.
	prov := provider.New(0)
	var providerDrops atomic.Int64
	provSrv := httptest.NewServer(dropAnswers(prov, providerErr, &providerDrops))
	t.Cleanup(provSrv.Close)

	// The payments service, in process; the clients reach it through the
	// lossy proxy.
	poolCfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	poolCfg.MaxConns = 2*workers + 4 // the claim and the handler's transaction each take one
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h, err := payments.NewHandler(payments.Config{
		Pool:     pool,
		Provider: &provider.Client{BaseURL: provSrv.URL},
		// Warnings are the expected provider failures; errors are not.
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		t.Fatal(err)
	}
	upstream := httptest.NewServer(h)
	t.Cleanup(upstream.Close)
	var proxyDrops atomic.Int64
	proxy := httptest.NewServer(lossyProxy(t, upstream.URL, proxyLoss, &proxyDrops))
	t.Cleanup(proxy.Close)

	// The clients: 8 workers, each payment retried with its key until 201.
	var completed, retries, replays atomic.Int64
	var mu sync.Mutex
	created := map[string]payments.Payment{} // by Idempotency-Key
	jobs := make(chan int)
	wctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	go func() {
		defer close(jobs)
		tick := time.NewTicker(pace)
		defer tick.Stop()
		for i := range total {
			select {
			case jobs <- i:
			case <-wctx.Done():
				return
			}
			<-tick.C
		}
	}()
	clientErrs := make(chan error, workers)
	hc := &http.Client{Timeout: 15 * time.Second}
	for range workers {
		go func() {
			for i := range jobs {
				key := fmt.Sprintf("test-payment-%04d", i)
				body := fmt.Sprintf(`{"account": "acct-%d", "amount": %d, "currency": "EUR"}`, i%37, 100+i)
				res, err := payWithRetries(wctx, hc, proxy.URL, key, body)
				retries.Add(int64(res.retries))
				if err != nil {
					clientErrs <- fmt.Errorf("payment %s: %w", key, err)
					return
				}
				if res.replayed {
					replays.Add(1)
				}
				mu.Lock()
				created[key] = res.payment
				mu.Unlock()
				completed.Add(1)
			}
			clientErrs <- nil
		}()
	}

	// The faults, at points of progress rather than of time, so they land
	// while payments are being made and events streamed whatever the
	// machine's speed.
	invoices := func() int {
		var n int
		if err := billingPool.QueryRow(ctx, `SELECT count(*) FROM invoices`).Scan(&n); err != nil {
			t.Fatalf("count invoices: %v", err)
		}
		return n
	}
	waitUntil(t, 60*time.Second, "250 payments", func() bool { return completed.Load() >= 250 })
	streamer.kill()
	streamer = e.start()
	waitUntil(t, 60*time.Second, "billing to invoice 350 payments", func() bool { return invoices() >= 350 })
	billing.kill()
	killedAt := invoices()
	paid := completed.Load()
	waitUntil(t, 60*time.Second, "payments made while billing is down", func() bool { return completed.Load() >= paid+20 })
	billing = startBilling(t, billingBin, billingArgs...)
	waitUntil(t, 60*time.Second, "700 payments", func() bool { return completed.Load() >= 700 })
	streamer.kill()
	streamer = e.start()

	for range workers {
		if err := <-clientErrs; err != nil {
			t.Fatal(err)
		}
	}
	if n := completed.Load(); n != total {
		t.Fatalf("%d of %d payments completed", n, total)
	}
	waitUntil(t, 60*time.Second, "an invoice for every payment", func() bool {
		if billing.exited() {
			billing.dump()
			t.Fatal("billing exited before invoicing every payment")
		}
		return invoices() >= total
	})
	billingMetrics := scrapeBilling(t, billing.metricsAddr())
	billing.stop()
	streamer.stop() // everything in flight acknowledged: the topic is final

	// Payments: one row per key, each the one the client was answered with.
	var rows, withCharge, distinctCharges int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(charge_id), count(DISTINCT charge_id) FROM payments`).Scan(&rows, &withCharge, &distinctCharges); err != nil {
		t.Fatal(err)
	}
	paymentIDs := map[string]string{} // payment id -> charge id
	for _, p := range queryPairs(t, pool, `SELECT id, charge_id FROM payments`) {
		paymentIDs[p[0]] = p[1]
	}
	for key, p := range created {
		if charge, ok := paymentIDs[p.ID]; !ok || charge != p.ChargeID {
			t.Errorf("key %s was answered with payment %s (charge %s); the database has charge %q (found: %v)", key, p.ID, p.ChargeID, charge, ok)
		}
	}

	// Charges: one per payment, each referencing its payment.
	charges := prov.List()
	chargeOf := map[string]string{}
	for _, c := range charges {
		if prev, dup := chargeOf[c.Reference]; dup {
			t.Errorf("payment %s charged twice: %s and %s", c.Reference, prev, c.ID)
		}
		chargeOf[c.Reference] = c.ID
	}
	for id, charge := range paymentIDs {
		if chargeOf[id] != charge {
			t.Errorf("payment %s records charge %q, the provider charged %q", id, charge, chargeOf[id])
		}
	}

	// Kafka: every event id at least once, nothing else.
	eventOf := map[string]string{} // payment id -> event id
	for _, p := range queryPairs(t, pool, `SELECT aggregate_id, id::text FROM outbox WHERE aggregate_type = 'payment'`) {
		eventOf[p[0]] = p[1]
	}
	records, perID := readTopic(t, adm, topic)
	duplicates := records - len(perID)
	for payment, id := range eventOf {
		if perID[id] == 0 {
			t.Errorf("event %s of payment %s is not in Kafka", id, payment)
		}
	}

	// Invoices: one per payment, made from that payment's event.
	var invoiceRows, distinctInvoiced, processed int
	if err := billingPool.QueryRow(ctx, `SELECT count(*), count(DISTINCT payment_id),
		(SELECT count(*) FROM processed_events WHERE consumer_group = $1) FROM invoices`, group).Scan(&invoiceRows, &distinctInvoiced, &processed); err != nil {
		t.Fatal(err)
	}
	invoiced := map[string]bool{}
	for _, inv := range queryPairs(t, billingPool, `SELECT payment_id, event_id FROM invoices`) {
		invoiced[inv[0]] = true
		if _, ok := paymentIDs[inv[0]]; !ok {
			t.Errorf("invoice for payment %s, which does not exist", inv[0])
		} else if eventOf[inv[0]] != inv[1] {
			t.Errorf("invoice for payment %s from event %s; its event is %s", inv[0], inv[1], eventOf[inv[0]])
		}
	}
	for id := range paymentIDs {
		if !invoiced[id] {
			t.Errorf("payment %s has no invoice", id)
		}
	}

	t.Logf("payments=%d charges=%d kafka_records=%d distinct_event_ids=%d kafka_duplicates=%d invoices=%d",
		rows, prov.Charges(), records, len(perID), duplicates, invoiceRows)
	t.Logf("client: %d payments, %d retries, %d answered by replay; proxy dropped %d responses; provider answers lost after charging %d, provider replays %d",
		len(created), retries.Load(), replays.Load(), proxyDrops.Load(), providerDrops.Load(), prov.Replays())
	t.Logf("billing: killed at %d invoices; after its restart it processed %.0f events and skipped %.0f as already processed; processed_events=%d",
		killedAt, billingMetrics["processed"], billingMetrics["duplicates"], processed)

	if rows != total || withCharge != total || distinctCharges != total || len(created) != total {
		t.Errorf("payments: %d rows, %d with a charge, %d distinct charges, %d answered keys; want %d each", rows, withCharge, distinctCharges, len(created), total)
	}
	if prov.Charges() != total {
		t.Errorf("provider made %d charges, want %d", prov.Charges(), total)
	}
	if len(eventOf) != total || len(perID) != total {
		t.Errorf("%d outbox events and %d distinct event ids in Kafka, want %d", len(eventOf), len(perID), total)
	}
	if invoiceRows != total || distinctInvoiced != total || processed != total {
		t.Errorf("billing: %d invoices for %d payments, %d processed events; want %d each", invoiceRows, distinctInvoiced, processed, total)
	}
}

// payResult is what a client got for one payment.
type payResult struct {
	payment  payments.Payment
	retries  int
	replayed bool // the 201 was a stored response (the first one was lost)
}

// payWithRetries posts one payment until it gets a 201, the first or a
// replay, resending the same key and body after anything else that a retry
// can cure: a lost response (connection closed, 502), a 5xx the service
// rolled back, or 409 while the first attempt is still running.
func payWithRetries(ctx context.Context, hc *http.Client, base, key, body string) (payResult, error) {
	var res payResult
	var last string
	for attempt := range 40 {
		if attempt > 0 {
			res.retries++
			select {
			case <-ctx.Done():
				return res, fmt.Errorf("%w after %d attempts; last: %s", ctx.Err(), attempt, last)
			case <-time.After(time.Duration(min(10*(attempt+1), 200)) * time.Millisecond):
			}
		}
		// The body is hidden behind a plain io.Reader: with a replayable
		// body and an Idempotency-Key header, net/http's Transport itself
		// silently resends a request whose reused connection was closed
		// without an answer, and this client would never see the drops it
		// is here to retry.
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/payments", io.NopCloser(strings.NewReader(body)))
		if err != nil {
			return res, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := hc.Do(req)
		if err != nil {
			last = err.Error()
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			last = err.Error()
			continue
		}
		last = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(b))
		switch resp.StatusCode {
		case http.StatusCreated:
			if err := json.Unmarshal(b, &res.payment); err != nil {
				return res, fmt.Errorf("201 with %q: %v", b, err)
			}
			if loc := resp.Header.Get("Location"); loc != "/payments/"+res.payment.ID || res.payment.ChargeID == "" {
				return res, fmt.Errorf("201 with Location %q and %s", loc, b)
			}
			res.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
			return res, nil
		case http.StatusConflict, http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			continue
		default:
			return res, errors.New(last) // 400, 402, 422: a bug in the service or the test
		}
	}
	return res, fmt.Errorf("no 201 after 40 attempts; last: %s", last)
}

var errDropped = errors.New("response dropped by the test proxy")

// lossyProxy is a reverse proxy to target that loses rate of the responses
// after target has sent them, so after the request was handled (and, behind
// the idempotency middleware, committed): half as a closed connection, half
// as a 502, never the real answer.
func lossyProxy(t *testing.T, target string, rate float64, drops *atomic.Int64) http.Handler {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		ModifyResponse: func(*http.Response) error {
			if rand.Float64() < rate {
				return errDropped
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if errors.Is(err, errDropped) {
				drops.Add(1)
				if rand.IntN(2) == 0 {
					panic(http.ErrAbortHandler) // net/http closes the connection, quietly
				}
			}
			w.WriteHeader(http.StatusBadGateway)
		},
	}
}

// dropAnswers runs h and then loses rate of its answers, as a 503 or a
// closed connection: for the provider, a charge was made and its caller
// does not know.
func dropAnswers(h http.Handler, rate float64, drops *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rand.Float64() < rate {
			drops.Add(1)
			if rand.IntN(2) == 0 {
				panic(http.ErrAbortHandler)
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

// readTopic reads topic from the start to its end offsets and returns how
// many records it holds and how often each event id occurs.
func readTopic(t *testing.T, adm *kadm.Client, topic string) (int, map[string]int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	want := 0
	ends.Each(func(o kadm.ListedOffset) { want += int(o.Offset) })
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	perID := map[string]int{}
	records := 0
	for records < want && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			records++
			perID[header(r, "id")]++
		})
	}
	if records < want {
		t.Fatalf("read %d of the %d records in %s", records, want, topic)
	}
	return records, perID
}

func applySQLFiles(t *testing.T, dbURL string, files ...string) {
	t.Helper()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		testenv.Exec(t, dbURL, string(b))
	}
}

// queryPairs returns the rows of a two-column text query.
func queryPairs(t *testing.T, pool *pgxpool.Pool, sql string) [][2]string {
	t.Helper()
	rows, err := pool.Query(testenv.Context(t), sql)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out [][2]string
	for rows.Next() {
		var a, b *string
		if err := rows.Scan(&a, &b); err != nil {
			t.Fatal(err)
		}
		var p [2]string
		if a != nil {
			p[0] = *a
		}
		if b != nil {
			p[1] = *b
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitUntil is eventually with a faster poll: thresholds of progress are
// crossed quickly.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// buildBilling builds examples/billing, which the test runs as a process
// of its own so that it can be SIGKILLed like a real consumer.
func buildBilling(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "billing")
	out, err := exec.Command("go", "build", "-o", bin, "../examples/billing").CombinedOutput()
	if err != nil {
		t.Fatalf("build examples/billing: %v\n%s", err, out)
	}
	return bin
}

// billingProcess is a running examples/billing.
type billingProcess struct {
	t    *testing.T
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // valid once done is closed
}

func startBilling(t *testing.T, bin string, args ...string) *billingProcess {
	t.Helper()
	log, err := os.CreateTemp(t.TempDir(), "billing-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := &billingProcess{t: t, cmd: cmd, log: log.Name(), done: make(chan struct{})}
	go func() { b.err = cmd.Wait(); log.Close(); close(b.done) }()
	t.Cleanup(func() {
		if !b.exited() {
			_ = cmd.Process.Kill()
			<-b.done
		}
		if t.Failed() {
			b.dump()
		}
	})
	return b
}

func (b *billingProcess) exited() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// kill SIGKILLs it: no offset commit, no leaving the group.
func (b *billingProcess) kill() {
	_ = b.cmd.Process.Signal(syscall.SIGKILL)
	<-b.done
}

// stop sends SIGTERM and expects a clean exit.
func (b *billingProcess) stop() {
	b.t.Helper()
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
		if b.err != nil {
			b.dump()
			b.t.Fatalf("billing exited with %v after SIGTERM", b.err)
		}
	case <-time.After(60 * time.Second):
		b.t.Fatal("billing did not stop within 60s of SIGTERM")
	}
}

func (b *billingProcess) dump() {
	out, _ := os.ReadFile(b.log)
	if len(out) > 20000 {
		out = out[len(out)-20000:]
	}
	b.t.Logf("billing log (%s):\n%s", b.log, out)
}

var billingMetricsLine = regexp.MustCompile(`msg="serving /metrics" addr=(\S+)`)

// metricsAddr is where billing serves /metrics, from its log.
func (b *billingProcess) metricsAddr() string {
	b.t.Helper()
	var addr string
	waitUntil(b.t, 30*time.Second, "billing's /metrics address", func() bool {
		out, _ := os.ReadFile(b.log)
		if m := billingMetricsLine.FindSubmatch(out); m != nil {
			addr = string(m[1])
		}
		return addr != ""
	})
	return addr
}

// scrapeBilling returns billing's consumer counters by short name
// (processed, duplicates, failures, ...).
func scrapeBilling(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape billing: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, "{")
		if !ok || !strings.HasPrefix(name, "cdc_outbox_consumer_") {
			continue
		}
		_, value, _ := strings.Cut(rest, "} ")
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			out[strings.TrimSuffix(strings.TrimPrefix(name, "cdc_outbox_consumer_"), "_total")] = v
		}
	}
	return out
}
