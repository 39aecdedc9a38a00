package charttest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// The real binary, built once from this checkout (the image's
// /usr/local/bin/cdc-outbox).
var binary struct {
	once sync.Once
	path string
	err  error
}

func cdcOutbox(t *testing.T) string {
	t.Helper()
	binary.once.Do(func() {
		dir, err := os.MkdirTemp("", "charttest")
		if err != nil {
			binary.err = err
			return
		}
		binary.path = filepath.Join(dir, "cdc-outbox")
		// In the checkout, with the streamer's own go.mod.
		build := exec.Command("go", "build", "-o", binary.path, "./cmd/cdc-outbox")
		build.Dir = repoRoot
		out, err := build.CombinedOutput()
		if err != nil {
			binary.err = fmt.Errorf("build cdc-outbox: %v\n%s", err, out)
		}
	})
	if binary.err != nil {
		t.Fatal(binary.err)
	}
	return binary.path
}

// dockerfileExec returns the image's ENTRYPOINT and CMD, which the
// container runs when its command and args are empty.
func dockerfileExec(t *testing.T) (entrypoint, cmd []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		for prefix, into := range map[string]*[]string{"ENTRYPOINT ": &entrypoint, "CMD ": &cmd} {
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				if err := json.Unmarshal([]byte(rest), into); err != nil {
					t.Fatalf("Dockerfile %s: want the exec form: %v", l, err)
				}
			}
		}
	}
	if len(entrypoint) == 0 {
		t.Fatal("Dockerfile: no ENTRYPOINT")
	}
	return entrypoint, cmd
}

// podProcess is the rendered pod's container run as a process on this
// machine: its command (the image's ENTRYPOINT and CMD, or the pod's), its
// environment (values, secrets, the downward API), and its mounts
// (ConfigMap and Secret files) under a directory of its own. The one
// change: CDC_OUTBOX_HTTP_ADDR gives each process a free loopback port, as
// each pod's network namespace gives it its own port 8080.
type podProcess struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	log  string
	done chan error
}

func startPod(t *testing.T, o *objects, name string, secretData map[string]map[string]string) *podProcess {
	t.Helper()
	c := o.container(t)
	spec := o.deployment.Spec.Template.Spec
	root := t.TempDir()
	// Mounted paths in the configuration and the environment point under
	// root, where the files are.
	var pairs []string
	for _, m := range c.VolumeMounts {
		pairs = append(pairs, m.MountPath+"/", filepath.Join(root, m.MountPath)+"/")
	}
	relocate := strings.NewReplacer(pairs...)
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		v := volumes[m.Name]
		files := map[string]string{}
		var items []corev1.KeyToPath
		switch {
		case v.ConfigMap != nil:
			cm := o.configMaps[v.ConfigMap.Name]
			if cm == nil {
				t.Fatalf("volume %s: no ConfigMap %s", v.Name, v.ConfigMap.Name)
			}
			for k, d := range cm.Data {
				files[k] = relocate.Replace(d)
			}
			items = v.ConfigMap.Items
		case v.Secret != nil:
			data, ok := secretData[v.Secret.SecretName]
			if !ok {
				t.Fatalf("volume %s: no Secret %s", v.Name, v.Secret.SecretName)
			}
			files = data
			items = v.Secret.Items
		}
		if len(items) > 0 {
			picked := map[string]string{}
			for _, it := range items {
				picked[it.Path] = files[it.Key]
			}
			files = picked
		}
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for k, d := range files {
			if err := os.WriteFile(filepath.Join(dir, k), []byte(d), 0o440); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The container's environment is what the pod spec gives it, and PATH
	// (the image's); nothing of this test's environment leaks in.
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + root}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+relocate.Replace(e.Value))
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secretData[ref.Name][ref.Key]
			if !ok {
				t.Fatalf("env %s: no key %s in Secret %s", e.Name, ref.Key, ref.Name)
			}
			env = append(env, e.Name+"="+v)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env = append(env, e.Name+"="+name)
		default:
			t.Fatalf("env %s: %+v is not something this test resolves", e.Name, e.ValueFrom)
		}
	}
	env = append(env, "CDC_OUTBOX_HTTP_ADDR=127.0.0.1:0")

	entrypoint, cmd := dockerfileExec(t)
	if len(c.Command) > 0 {
		entrypoint, cmd = c.Command, nil
	}
	if len(c.Args) > 0 {
		cmd = c.Args
	}
	argv := append(append([]string{}, entrypoint...), cmd...)
	if argv[0] != "cdc-outbox" && argv[0] != "/usr/local/bin/cdc-outbox" {
		t.Fatalf("the container runs %q, not the image's cdc-outbox", argv)
	}
	argv[0] = cdcOutbox(t)

	logf, err := os.Create(filepath.Join(root, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	p := &podProcess{t: t, name: name, log: logf.Name(), done: make(chan error, 1)}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env, p.cmd.Dir = env, root
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			p.dump()
		}
	})
	return p
}

func (p *podProcess) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

func (p *podProcess) dump() {
	s := p.logText()
	if len(s) > 20000 {
		s = s[len(s)-20000:]
	}
	p.t.Logf("%s log:\n%s", p.name, s)
}

// stoppedLine is the stream's last line on a clean stop, with the position
// it confirmed last.
var stoppedLine = regexp.MustCompile(`"msg":"stopped"[^\n]*"confirmed_lsn":([0-9]+)`)

var httpAddrLine = regexp.MustCompile(`"msg":"serving /metrics, /healthz and /readyz","addr":"([^"]+)"`)

// addr is where the pod's HTTP endpoint listens, from its log.
func (p *podProcess) addr() string {
	p.t.Helper()
	var addr string
	eventually(p.t, 30*time.Second, p.name+"'s HTTP endpoint", func() string {
		m := httpAddrLine.FindStringSubmatch(p.logText())
		if m == nil {
			return "no address in the log yet"
		}
		addr = m[1]
		return ""
	})
	return addr
}

// probe is the kubelet's HTTP probe: the status code and the body.
func (p *podProcess) probe(addr string, probe *corev1.Probe) (int, string) {
	client := http.Client{Timeout: time.Duration(probe.TimeoutSeconds) * time.Second}
	resp, err := client.Get("http://" + addr + probe.HTTPGet.Path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// metric reads one unlabelled gauge from /metrics.
func metric(addr, name string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /metrics", name)
}

// sigterm is the kubelet stopping the container: SIGTERM, and SIGKILL at
// the end of the grace period. It returns how long the process took to
// exit, and fails unless it exited cleanly within the grace period.
func (p *podProcess) sigterm(grace time.Duration) time.Duration {
	p.t.Helper()
	start := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			p.t.Fatalf("%s exited with %v after SIGTERM", p.name, err)
		}
		return time.Since(start)
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Fatalf("%s did not exit within the grace period (%s) of SIGTERM; the kubelet would SIGKILL it", p.name, grace)
		return 0
	}
}

// eventually polls cond until it returns "" or the deadline passes; then it
// fails with what cond said last.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		last := cond()
		if last == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last seen: %s", what, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ------------------------------------------------------------- servers

// world is one test's database, outbox table, slot and topic prefix.
type world struct {
	url, slot, prefix string
	pool              *pgxpool.Pool
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{url: testenv.Database(t), slot: testenv.Name("slot"), prefix: testenv.Name("chart")}
	sql, err := os.ReadFile(filepath.Join(repoRoot, "sql/publication.sql"))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, w.url, string(sql))
	w.pool, err = pgxpool.New(testenv.Context(t), w.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.pool.Close)
	return w
}

// values are the chart values that point a release at this world; extra
// is further YAML for config.
func (w *world) values(t *testing.T, brokers []string, extra string) map[string]any {
	t.Helper()
	b, _ := json.Marshal(brokers)
	return values(t, fmt.Sprintf(`
config:
  postgres-url: %q
  kafka-brokers: %s
  slot: %s
  topic: %s.{aggregate_type}
  status-interval: 100ms
%s
postgres:
  passwordSecret: {name: db, key: password}
shutdownTimeoutSeconds: 20
`, w.url, b, w.slot, w.prefix, extra))
}

// writers commit outbox events until stop is closed, from n writers in
// transactions of 1 to 10 rows, and return the ids they committed.
func (w *world) writers(ctx context.Context, n int, stop <-chan struct{}) func() ([]string, error) {
	var mu sync.Mutex
	var ids []string
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			size := []int{1, 3, 10, 5}[i%4]
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				tx, err := w.pool.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				var batch []string
				for r := 0; r < size; r++ {
					var id int64
					if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
						VALUES ('payment', $1, 'PaymentCreated', $2) RETURNING id`,
						fmt.Sprintf("w%d", i), fmt.Sprintf(`{"writer": %d, "seq": %d}`, i, seq)).Scan(&id); err != nil {
						_ = tx.Rollback(ctx)
						errs <- err
						return
					}
					batch = append(batch, strconv.FormatInt(id, 10))
				}
				if err := tx.Commit(ctx); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				ids = append(ids, batch...)
				mu.Unlock()
				// A steady rate rather than as fast as possible: the
				// takeover happens while events keep arriving.
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	return func() ([]string, error) {
		for i := 0; i < n; i++ {
			if err := <-errs; err != nil {
				return nil, err
			}
		}
		return ids, nil
	}
}

// verdict is what the topic holds against what was committed.
type verdict struct{ expected, missing, duplicates int }

func (v verdict) String() string {
	return fmt.Sprintf("expected=%d missing=%d duplicates=%d", v.expected, v.missing, v.duplicates)
}

// verify reads the payment topic from the start until every id arrived or
// timeout, counting duplicates; opts are added to the consumer's.
func (w *world) verify(t *testing.T, ids []string, timeout time.Duration, opts ...kgo.Opt) verdict {
	t.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	cl := testenv.KafkaClient(t, append([]kgo.Opt{kgo.ConsumeTopics(w.prefix + ".payment"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(250 * time.Millisecond)}, opts...)...)
	seen := map[string]int{}
	found := 0
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for found < len(want) && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == "id" {
					id := string(h.Value)
					seen[id]++
					if seen[id] == 1 && want[id] {
						found++
					}
				}
			}
		})
	}
	v := verdict{expected: len(want), missing: len(want) - found}
	for _, n := range seen {
		v.duplicates += n - 1
	}
	return v
}

// waitStreaming waits until a walsender streams from the slot.
func (w *world) waitStreaming(t *testing.T) {
	t.Helper()
	eventually(t, 60*time.Second, "a walsender streaming from slot "+w.slot, func() string {
		var streaming bool
		err := w.pool.QueryRow(testenv.Context(t), `SELECT EXISTS (SELECT 1 FROM pg_replication_slots s
			JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1)`, w.slot).Scan(&streaming)
		if err != nil {
			return err.Error()
		}
		if !streaming {
			return "no walsender on the slot"
		}
		return ""
	})
}

// ------------------------------------------------------------ the tests

// TestRenderedPodStreams runs the container of each value set that the
// test servers can serve, as rendered: the image's command, the pod's
// environment with its secrets, the configuration file from the ConfigMap
// at its mount path. It streams: events written arrive in Kafka, and
// /readyz, the readiness probe, answers 200.
func TestRenderedPodStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs the test servers")
	}
	saslPassword, err := os.ReadFile(testenv.KafkaSASLPasswordFile(t))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(testenv.KafkaCAFile(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		brokers []string
		extra   string // more config
		values  string // more values
		opts    []kgo.Opt
	}{
		{name: "default", brokers: testenv.KafkaBrokers(t)},
		{name: "tls-sasl", brokers: testenv.KafkaSASLBrokers(t),
			extra:  fmt.Sprintf("  kafka-sasl-mechanism: scram-sha-512\n  kafka-sasl-username: %s\n", testenv.KafkaSASLUser(t)),
			values: "kafka:\n  sasl: {passwordSecret: {name: kafka-cdc, key: password}}\n  tls: {enabled: true, secretName: kafka-ca, caKey: ca.crt}\n"},
		{name: "exactly-once", brokers: testenv.KafkaBrokers(t), extra: "  delivery: exactly-once\n  checkpoint-topic: " + testenv.Name("checkpoints") + "\n",
			opts: []kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted())}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			vals := w.values(t, tc.brokers, tc.extra)
			for k, v := range values(t, tc.values) {
				vals[k] = v
			}
			o := decode(t, "payments", vals)
			data := map[string]map[string]string{
				"db":        {"password": "unused-by-trust-auth"},
				"kafka-cdc": {"password": strings.TrimRight(string(saslPassword), "\n")},
				"kafka-ca":  {"ca.crt": string(ca)},
			}
			validatePod(t, o, data)
			p := startPod(t, o, "payments-0", data)
			addr := p.addr()
			w.waitStreaming(t)
			readiness := o.container(t).ReadinessProbe
			eventually(t, 30*time.Second, "the readiness probe to pass", func() string {
				if code, body := p.probe(addr, readiness); code != 200 || !strings.HasPrefix(body, "ready: streaming") {
					return fmt.Sprintf("%d %s", code, body)
				}
				return ""
			})
			stop := make(chan struct{})
			wait := w.writers(testenv.Context(t), 2, stop)
			time.Sleep(time.Second) // the workload's length, not a wait for a condition
			close(stop)
			ids, err := wait()
			if err != nil {
				t.Fatal(err)
			}
			v := w.verify(t, ids, 2*time.Minute, tc.opts...)
			t.Logf("verifier %s: %s", tc.name, v)
			if v.missing != 0 || v.expected == 0 {
				t.Fatalf("verifier: %s", v)
			}
			p.sigterm(time.Duration(*o.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second)
		})
	}
}

// TestRollingUpdate simulates the chart's rolling update with the real
// binary, under writers: the old replica set's holder streams; the new
// replica set's pod starts with the new release's settings and must become
// ready while the old one holds the slot (or the update stalls), as a
// standby (cdc_outbox_slot_holder 0); the old holder then gets SIGTERM, as
// the kubelet sends it, drains and releases the slot, and the new pod
// takes it over. Nothing is missing; duplicates are counted (none with
// exactly-once delivery).
func TestRollingUpdate(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs the test servers")
	}
	for _, tc := range []struct {
		name  string
		extra string
		opts  []kgo.Opt
	}{
		{name: "at-least-once"},
		{name: "exactly-once", extra: "  delivery: exactly-once\n  checkpoint-topic: " + testenv.Name("checkpoints") + "\n",
			opts: []kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted())}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			data := map[string]map[string]string{"db": {"password": "unused-by-trust-auth"}}
			oldVals := w.values(t, testenv.KafkaBrokers(t), tc.extra)
			oldVals["image"] = map[string]any{"repository": "cdc-outbox", "tag": "0.1.0"}
			newVals := w.values(t, testenv.KafkaBrokers(t), tc.extra)
			newVals["image"] = map[string]any{"repository": "cdc-outbox", "tag": "0.1.1"}
			oldObjs, newObjs := decode(t, "payments", oldVals), decode(t, "payments", newVals)
			readiness := newObjs.container(t).ReadinessProbe
			grace := time.Duration(*oldObjs.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second

			old := startPod(t, oldObjs, "payments-old", data)
			oldAddr := old.addr()
			w.waitStreaming(t)
			stop := make(chan struct{})
			wait := w.writers(testenv.Context(t), 4, stop)

			next := startPod(t, newObjs, "payments-new", data)
			nextAddr := next.addr()
			eventually(t, 60*time.Second, "the new pod to be ready as a standby while the old one holds the slot", func() string {
				code, body := next.probe(nextAddr, readiness)
				if code != 200 || !strings.HasPrefix(body, "ready: standby") {
					return fmt.Sprintf("/readyz %d %s", code, body)
				}
				if v, err := metric(nextAddr, "cdc_outbox_slot_holder"); err != nil || v != 0 {
					return fmt.Sprintf("cdc_outbox_slot_holder %v %v", v, err)
				}
				return ""
			})
			if v, err := metric(oldAddr, "cdc_outbox_slot_holder"); err != nil || v != 1 {
				t.Fatalf("the old pod's cdc_outbox_slot_holder = %v (%v), want 1", v, err)
			}
			if v, err := metric(nextAddr, "cdc_outbox_ready"); err != nil || v != 0 {
				t.Fatalf("the standby's cdc_outbox_ready = %v (%v), want 0: it streams nothing", v, err)
			}

			// The update goes on: the old pod is stopped as the kubelet
			// stops it, while the writers write.
			time.Sleep(time.Second) // events flowing through the old holder first, not a wait for a condition
			sigterm := time.Now()
			drain := old.sigterm(grace)
			released := time.Now()
			// It confirmed its last position before it let the slot go: the
			// slot is at or past the position its last log line gives.
			m := stoppedLine.FindStringSubmatch(old.logText())
			if m == nil {
				t.Fatalf("the old holder did not log its final position:\n%s", old.logText())
			}
			final, err := strconv.ParseInt(m[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			var slotLSN int64
			if err := w.pool.QueryRow(testenv.Context(t), `SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1`, w.slot).Scan(&slotLSN); err != nil {
				t.Fatal(err)
			}
			if slotLSN < final {
				t.Fatalf("the slot's confirmed_flush_lsn %s is behind the old holder's final position %s: the takeover repeats what it confirmed", pglogrepl.LSN(slotLSN), pglogrepl.LSN(final))
			}
			var streaming time.Time
			eventually(t, 30*time.Second, "the new pod to take over the slot", func() string {
				code, body := next.probe(nextAddr, readiness)
				if code != 200 || !strings.HasPrefix(body, "ready: streaming") {
					return fmt.Sprintf("/readyz %d %s", code, body)
				}
				streaming = time.Now()
				return ""
			})
			takeover := streaming.Sub(released)
			time.Sleep(time.Second) // events flowing through the new holder, not a wait for a condition
			close(stop)
			ids, err := wait()
			if err != nil {
				t.Fatal(err)
			}
			v := w.verify(t, ids, 3*time.Minute, tc.opts...)
			t.Logf("rolling update, %s: %s; SIGTERM to the old holder's exit %s, its exit to the new holder streaming %s (from SIGTERM %s)",
				tc.name, v, drain.Round(time.Millisecond), takeover.Round(time.Millisecond), streaming.Sub(sigterm).Round(time.Millisecond))
			if v.missing != 0 {
				t.Fatalf("verifier: %s", v)
			}
			// The old holder confirmed what it had in flight before it
			// released the slot, rather than giving up at the timeout.
			if drain >= 20*time.Second || strings.Contains(old.logText(), "shutdown timeout") {
				t.Fatalf("the old holder took %s to drain (shutdown-timeout 20s):\n%s", drain, old.logText())
			}
			if tc.name == "exactly-once" && v.duplicates != 0 {
				t.Fatalf("verifier (read_committed): %s: exactly-once delivery repeated events across a rolling update", v)
			}
			// The standby retries the slot every second: a takeover well
			// within the readiness probe's window keeps the pause short.
			if takeover > 10*time.Second {
				t.Fatalf("the new holder streamed %s after the old one exited, want under 10 s", takeover)
			}
			next.sigterm(grace)
		})
	}
}
