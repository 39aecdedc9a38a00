package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// readmeBlock is a fenced block of the README: its language and text.
type readmeBlock struct {
	lang, text string
}

// readmeSection returns the fenced blocks of the README's section titled
// heading, in order.
func readmeSection(t *testing.T, heading string) []readmeBlock {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", heading)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var blocks []readmeBlock
	lines := strings.Split(section, "\n")
	for i := 0; i < len(lines); i++ {
		lang, ok := strings.CutPrefix(lines[i], "```")
		if !ok {
			continue
		}
		var text []string
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			text = append(text, lines[i])
		}
		blocks = append(blocks, readmeBlock{lang: strings.TrimSpace(lang), text: strings.Join(text, "\n")})
	}
	return blocks
}

// expectedOutput turns a README output block into a pattern for the whole
// output: a line "..." stands for any lines, and "..." within a line for
// any text; trailing spaces do not count.
func expectedOutput(block string) *regexp.Regexp {
	var p strings.Builder
	p.WriteString(`\A`)
	for _, l := range strings.Split(strings.TrimRight(block, "\n"), "\n") {
		if strings.TrimSpace(l) == "..." {
			p.WriteString(`(?:[^\n]*\n)*?`)
			continue
		}
		p.WriteString(strings.ReplaceAll(regexp.QuoteMeta(strings.TrimRight(l, " ")), `\.\.\.`, `[^\n]*`))
		p.WriteString(`[ \t]*\n`)
	}
	p.WriteString(`\z`)
	return regexp.MustCompile(p.String())
}

func TestExpectedOutput(t *testing.T) {
	re := expectedOutput("slot: s\n  active: yes (pid ...)\n...\nverdict: healthy\n")
	for out, want := range map[string]bool{
		"slot: s\n  active: yes (pid 42)\nverdict: healthy\n":             true,
		"slot: s\n  active: yes (pid 42)\na\nb\nverdict: healthy  \n":     true,
		"slot: s\n  active: no\nverdict: healthy\n":                       false,
		"slot: s\n  active: yes (pid 42)\nverdict: healthy\nwarning: x\n": false,
	} {
		if re.MatchString(out) != want {
			t.Errorf("%q: match %v, want %v", out, !want, want)
		}
	}
}

// TestReadmeFiveMinutes runs the README's "Five minutes against your own
// PostgreSQL and Kafka" as a reader would, block by block, against the
// test's servers: a database of its own as DATABASE_URL, the test broker
// as KAFKA_BROKERS. A block followed by an output block is run until its
// output is that (the reader waits a moment too); the block that starts
// the streamer runs in the background, as in a terminal of its own, and is
// stopped with SIGINT, as with Ctrl-C, before the block that drops the
// slot. What the reader supplies or builds is replaced, and each
// replacement must find its text, so the README cannot drift away from
// what runs: the two exports (the test's servers), `make build` (the
// test's binary; TestMakeBuildEmbedsVersion runs make build),
// bin/cdc-outbox (that binary) and localhost:8080 (a free port, given as
// CDC_OUTBOX_HTTP_ADDR, since another process may hold 8080). Then the
// event is read back from Kafka: topic, key, value and headers as the
// README says.
func TestReadmeFiveMinutes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and Kafka")
	}
	url := testenv.Database(t)
	brokers := testenv.KafkaBrokers(t)
	const slot = "cdc_outbox" // the default, as the README uses it
	var elsewhere string
	if err := testenv.Connect(t, url).QueryRow(testenv.Context(t),
		`SELECT coalesce((SELECT database FROM pg_replication_slots WHERE slot_name = $1), '')`, slot).Scan(&elsewhere); err != nil {
		t.Fatal(err)
	}
	if elsewhere != "" {
		t.Fatalf("the test server has a slot %s (database %s), left by an earlier run: drop it (SELECT pg_drop_replication_slot('%s'))", slot, elsewhere, slot)
	}
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	environ := append(os.Environ(), "DATABASE_URL="+url, "KAFKA_BROKERS="+brokers[0], "CDC_OUTBOX_HTTP_ADDR="+addr)
	if _, err := exec.LookPath("psql"); err != nil {
		if found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql"); len(found) > 0 {
			environ = append(environ, "PATH="+filepath.Dir(found[len(found)-1])+":"+os.Getenv("PATH"))
		}
	}

	replacements := []struct {
		re   *regexp.Regexp
		with string
		used bool
	}{
		{re: regexp.MustCompile(`(?m)^export DATABASE_URL=.*\n?`)},
		{re: regexp.MustCompile(`(?m)^export KAFKA_BROKERS=.*\n?`)},
		{re: regexp.MustCompile(`(?m)^make build\n?`)},
		{re: regexp.MustCompile(`\bbin/cdc-outbox\b`), with: binary},
		{re: regexp.MustCompile(`\blocalhost:8080\b`), with: addr},
	}
	blocks := readmeSection(t, "Five minutes against your own PostgreSQL and Kafka")
	var streamer *exec.Cmd
	var streamerLog string
	streamerDone := make(chan error, 1)
	stopStreamer := func() {
		t.Helper()
		if streamer == nil {
			t.Fatal("the README drops the slot before it started the streamer")
		}
		if err := streamer.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-streamerDone:
			if err != nil {
				b, _ := os.ReadFile(streamerLog)
				t.Fatalf("the streamer exited with %v after Ctrl-C, want 0:\n%s", err, b)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the streamer did not stop within 60s of Ctrl-C")
		}
		streamer = nil
		testenv.WaitSlotInactive(t, url, slot) // its walsender may outlive it a moment
	}
	run := func(script string) (string, error) {
		c := exec.Command("bash", "-euo", "pipefail", "-c", script)
		c.Dir, c.Env = root, environ
		out, err := c.CombinedOutput()
		return string(out), err
	}

	ran, checked := 0, 0
	for i, b := range blocks {
		if b.lang != "sh" {
			continue
		}
		script := b.text
		for j := range replacements {
			if replacements[j].re.MatchString(script) {
				replacements[j].used = true
				script = replacements[j].re.ReplaceAllLiteralString(script, replacements[j].with)
			}
		}
		if strings.TrimSpace(script) == "" {
			continue
		}
		ran++
		switch {
		case strings.HasPrefix(strings.TrimSpace(script), binary+" run "):
			if strings.Contains(strings.TrimSpace(script), "\n") {
				t.Fatalf("the block that starts the streamer has more than that command:\n%s", b.text)
			}
			log, err := os.CreateTemp(t.TempDir(), "streamer-*.log")
			if err != nil {
				t.Fatal(err)
			}
			streamerLog = log.Name()
			streamer = exec.Command("bash", "-c", "exec "+script)
			streamer.Dir, streamer.Env = root, environ
			streamer.Stdout, streamer.Stderr = log, log
			if err := streamer.Start(); err != nil {
				t.Fatal(err)
			}
			cmd := streamer
			go func() { streamerDone <- cmd.Wait(); log.Close() }()
			t.Cleanup(func() {
				if cmd.ProcessState == nil {
					_ = cmd.Process.Kill()
				}
			})
			t.Logf("started, as in a terminal of its own: %s", b.text)
		case i+1 < len(blocks) && blocks[i+1].lang == "text":
			want := expectedOutput(blocks[i+1].text)
			// The reader runs it again until it says so: a poll with a deadline.
			deadline := time.Now().Add(60 * time.Second)
			out, err := run(script)
			for err != nil || !want.MatchString(out) {
				if time.Now().After(deadline) {
					t.Fatalf("the README's\n%s\nsays\n%s\nbut for 60s it said (%v)\n%s", b.text, blocks[i+1].text, err, out)
				}
				time.Sleep(200 * time.Millisecond) // the poll's period
				out, err = run(script)
			}
			checked++
			t.Logf("%s\n%s", b.text, out)
		default:
			if strings.Contains(script, "pg_drop_replication_slot") && streamer != nil {
				stopStreamer()
				t.Logf("stopped the streamer with SIGINT (Ctrl-C): exit 0")
			}
			if out, err := run(script); err != nil {
				t.Fatalf("the README's\n%s\nfailed: %v\n%s", b.text, err, out)
			}
			t.Logf("%s", b.text)
		}
	}
	for _, r := range replacements {
		if !r.used {
			t.Errorf("the README's five minutes no longer have %s: what does the reader do instead? (change this test with it)", r.re)
		}
	}
	if ran < 6 || checked < 3 {
		t.Fatalf("ran %d blocks and checked the output of %d: the README's section changed shape", ran, checked)
	}
	if streamer != nil {
		t.Error("the README never stops the streamer it started")
	}
	var left bool
	if err := testenv.Connect(t, url).QueryRow(testenv.Context(t),
		`SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&left); err != nil || left {
		t.Errorf("the slot %s is still there after the README's clean-up (err %v)", slot, err)
	}

	// The event, as the README describes it, in Kafka: topic, key, value,
	// headers; the source header is this database's outbox table (which the
	// clean-up dropped, so the test knows it by the database).
	var sysid, dbOID string
	if err := testenv.Connect(t, url).QueryRow(testenv.Context(t), `SELECT system_identifier::text,
		(SELECT oid::text FROM pg_database WHERE datname = current_database()) FROM pg_control_system()`).Scan(&sysid, &dbOID); err != nil {
		t.Fatal(err)
	}
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics("outbox.event.payment"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(testenv.Context(t), 60*time.Second)
	defer cancel()
	for found := false; !found; {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("the README's event (key pay-1, source of this database) is not in outbox.event.payment within 60s")
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if string(r.Key) != "pay-1" || !strings.HasPrefix(header(r, "source"), sysid+"/"+dbOID+"/") {
				return
			}
			found = true
			if string(r.Value) != `{"amount": 1200}` || header(r, "event_type") != "PaymentCreated" ||
				header(r, "aggregate_type") != "payment" || header(r, "id") == "" {
				t.Errorf("the README's event: value %s, headers %v", r.Value, r.Headers)
			}
		})
	}
}
