package e2e

import (
	"encoding/json"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// failoverStatus is what status --json says of failover readiness.
type failoverStatus struct {
	Ready    bool   `json:"failover_ready"`
	Reason   string `json:"failover_not_ready_reason"`
	Standbys []struct {
		Standby string `json:"standby"`
		State   string `json:"state"`
	} `json:"failover_standbys"`
	Warnings []string `json:"warnings"`
}

func readFailoverStatus(t *testing.T, url, slot string) (failoverStatus, string) {
	t.Helper()
	out, _ := exec.Command(binary, "status", "--json", "--postgres-url", url, "--slot", slot).Output()
	var st failoverStatus
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	return st, string(out)
}

// standbyCopy is whether the standby at url has a synchronized copy of
// slot, and whether it is temporary.
func standbyCopy(t *testing.T, url, slot string) (exists, temporary bool) {
	t.Helper()
	conn := testenv.Connect(t, url)
	err := conn.QueryRow(testenv.Context(t), `SELECT coalesce(bool_or(synced), false), coalesce(bool_or(temporary), false)
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&exists, &temporary)
	if err != nil {
		t.Fatalf("read the standby's copy of %s: %v", slot, err)
	}
	return exists, temporary
}

// TestFailoverReadinessFromTheStandby, on PostgreSQL 17 and 18: failover readiness
// is judged where it matters, on the standby. A failover slot that nothing
// has consumed yet, made before transactions the standby replays, is
// synchronized to the standby as a temporary copy (its catalog xmin is
// older than the standby's own horizon), which a promotion would drop:
// status says not ready, temporary, naming the standby. Once cdc-outbox
// streams and confirms, the primary's slot passes the standby's position,
// the copy turns persistent, and cdc_outbox_slot_failover_ready turns 1,
// with the standby's state ready.
func TestFailoverReadinessFromTheStandby(t *testing.T) {
	for _, major := range []int{17, 18} {
		t.Run(strconv.Itoa(major), func(t *testing.T) { readinessFromTheStandby(t, major) })
	}
}

func readinessFromTheStandby(t *testing.T, major int) {
	ha := newHAPair(t, major, false)
	e := newEnvAt(t, ha.writers)
	e.runURL = ha.streamer
	testenv.Exec(t, ha.primary.URL, `SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`, e.slot)
	wl := newWorkload(e)
	ctx := testenv.Context(t)
	if err := wl.write(ctx, 0, 20, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the standby's temporary copy of the slot", func() bool {
		exists, temporary := standbyCopy(t, ha.standby.URL, e.slot)
		return exists && temporary
	})
	// status on the primary, its URL naming the standby too.
	st, out := readFailoverStatus(t, ha.writers, e.slot)
	standby := hostPort(t, ha.standby.URL)
	if st.Ready || st.Reason != "temporary" || len(st.Standbys) != 1 || st.Standbys[0].Standby != standby || st.Standbys[0].State != "temporary" ||
		!strings.Contains(strings.Join(st.Warnings, "\n"), "not ready for a failover to "+standby) {
		t.Fatalf("status while the standby's copy is temporary: want not ready, temporary, standby %s:\n%s", standby, out)
	}
	if exists, temporary := standbyCopy(t, ha.standby.URL, e.slot); !exists || !temporary {
		t.Fatal("the standby's copy turned persistent while status read it: the test proves nothing")
	}
	t.Logf("status with the standby's copy temporary: failover_ready=%v reason=%s", st.Ready, st.Reason)

	s := e.start("--slot-poll-interval", "1s")
	e.waitStreaming()
	w := startWriters(wl)
	readyMetric := `cdc_outbox_slot_failover_standby{standby="` + standby + `",state="ready"}`
	began := time.Now()
	eventually(t, 2*time.Minute, "cdc_outbox_slot_failover_ready 1 with the standby ready", func() bool {
		m := scrape(t, s.httpAddr())
		return m["cdc_outbox_slot_failover_ready"] == 1 && m[readyMetric] == 1
	})
	t.Logf("failover ready %s after the start, the standby's copy persistent", time.Since(began).Round(time.Millisecond))
	if exists, temporary := standbyCopy(t, ha.standby.URL, e.slot); !exists || temporary {
		t.Fatalf("cdc-outbox says ready while the standby's copy is exists=%v temporary=%v", exists, temporary)
	}
	if st, out := readFailoverStatus(t, ha.writers, e.slot); !st.Ready || st.Reason != "" || st.Standbys[0].State != "ready" {
		t.Fatalf("status once the copy is persistent: want ready:\n%s", out)
	}
	if !strings.Contains(s.logText(), "failover ready") {
		t.Fatalf("the streamer does not log that it is ready for a failover:\n%s", tailOf(s.logText(), 3000))
	}
	w.stop()
	wl.check([]string{"payment"}, "with failover readiness read from the standby")
	s.stop()
}

// TestFailoverInheritedStandbySlotsStall, on PostgreSQL 17 and 18: the primary
// names in synchronized_standby_slots a standby slot it does not have, as a
// promoted standby does that inherited the old primary's setting with its
// base backup. PostgreSQL holds the failover slot's walsender back and
// repeats a warning every few seconds; cdc-outbox says it once, as an
// error with the fix (ALTER SYSTEM SET synchronized_standby_slots = ...),
// sets cdc_outbox_standby_slots_blocking, and relays none of the repeats.
// Applying the fix it printed lets the events flow: none is missing.
func TestFailoverInheritedStandbySlotsStall(t *testing.T) {
	for _, major := range []int{17, 18} {
		t.Run(strconv.Itoa(major), func(t *testing.T) { inheritedStandbySlotsStall(t, major) })
	}
}

func inheritedStandbySlotsStall(t *testing.T, major int) {
	c := testenv.Cluster(t, testenv.ClusterOptions{Major: major, Config: []string{"synchronized_standby_slots = 'sb1'"}})
	e := newEnvAt(t, c.URL)
	s := e.start("--slot-poll-interval", "1s")
	e.waitStreaming()
	wl := newWorkload(e)
	ctx := testenv.Context(t)
	if err := wl.write(ctx, 0, 200, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "cdc_outbox_standby_slots_blocking 1", func() bool {
		return metricValue(t, s, "cdc_outbox_standby_slots_blocking") == 1
	})
	// Several monitor reads (every second) and walsender warnings later,
	// still one line.
	time.Sleep(6 * time.Second) // the window observed, not a wait for a condition
	log := s.logText()
	lines := regexp.MustCompile(`"msg":"PostgreSQL holds the stream back[^"]*Fix: ([^"]*)"`).FindAllStringSubmatch(log, -1)
	if len(lines) != 1 {
		t.Fatalf("%d log lines about the stall, want 1:\n%s", len(lines), tailOf(log, 4000))
	}
	fix := lines[0][1]
	t.Logf("the stall, said once: fix %q", fix)
	if !strings.Contains(fix, "ALTER SYSTEM SET synchronized_standby_slots = ''") || !strings.Contains(log, `"blocking":"sb1 (missing)"`) {
		t.Fatalf("the stall's line does not name sb1 and the fix:\n%s", tailOf(log, 4000))
	}
	if strings.Contains(log, "PostgreSQL sent a notice on the replication connection") {
		t.Fatalf("the walsender's warnings were relayed:\n%s", tailOf(log, 4000))
	}
	if v, _ := wl.verify([]string{"payment"}, 2*time.Second); v.missing == 0 {
		t.Fatalf("events streamed while synchronized_standby_slots held the walsender back (%s): the stall was not real", v)
	}

	// The fix as printed: the SQL up to the alternative in parentheses.
	sql, _, _ := strings.Cut(fix, " (or ")
	for _, stmt := range strings.Split(sql, ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			testenv.Exec(t, c.URL, stmt)
		}
	}
	wl.check([]string{"payment"}, "after applying the printed fix for synchronized_standby_slots")
	eventually(t, time.Minute, "cdc_outbox_standby_slots_blocking 0", func() bool {
		return metricValue(t, s, "cdc_outbox_standby_slots_blocking") == 0
	})
	s.stop()
}
