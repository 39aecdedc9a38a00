// Tests for the monitoring assets under deploy/: the Prometheus rules and
// configuration are checked and unit-tested with promtool, and the Grafana
// dashboard and the rules are checked against cdc-outbox's metric names (a
// contract, see internal/metrics).
//
// promtool is built once from a pinned Prometheus module version (the
// version docker-compose.yml runs, so that the rules are tested by the
// Prometheus that evaluates them) with `go install` into
// .local/promtool/<version>-<os>-<arch> of the checkout, beside the other
// downloads (the Kafka jars, PostgreSQL binaries), and reused from there;
// `make clean` keeps it. No registry this project uses ships a promtool of
// that version (Debian's prometheus package is 2.x). The first build takes
// minutes on two cores (measured: 6m17s with an empty Go build cache, about
// 9.5 minutes when the modules must be downloaded too, which is close to go
// test's default 10m -timeout; `make test` allows 60m), less when the Go
// build cache already holds the packages (a new clone on the same machine);
// later runs reuse the binary and the whole package takes about a second.
// Set PROMTOOL to use another promtool binary instead.
package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// promtoolModule is the Prometheus module version promtool is built from:
// Prometheus 3.16.0.
const (
	promtoolPackage = "github.com/prometheus/prometheus/cmd/promtool"
	promtoolVersion = "v0.316.0"
)

const (
	alertsFile     = "prometheus/alerts.yml"
	alertsTestFile = "prometheus/alerts_test.yml"
	configFile     = "prometheus/prometheus.yml"
	dashboardFile  = "grafana/cdc-outbox.json"
	datasourceFile = "grafana/provisioning/datasources/prometheus.yml"
	providerFile   = "grafana/provisioning/dashboards/cdc-outbox.yml"
)

// contract is every metric cdc-outbox exports (besides the Kafka client's
// cdc_outbox_kafka_* and the Go runtime's), with its labels.
var contract = map[string][]string{
	"cdc_outbox_events_total":               {"topic", "kind"},
	"cdc_outbox_transactions_total":         nil,
	"cdc_outbox_events_skipped_total":       {"reason"},
	"cdc_outbox_bad_events_total":           {"action", "kind"},
	"cdc_outbox_publish_errors_total":       nil,
	"cdc_outbox_lag_seconds":                nil,
	"cdc_outbox_replication_lag_bytes":      nil,
	"cdc_outbox_end_to_end_latency_seconds": nil, // histogram
	"cdc_outbox_receive_latency_seconds":    nil, // histogram
	"cdc_outbox_confirmed_lsn":              nil,
	"cdc_outbox_received_lsn":               nil,
	"cdc_outbox_inflight_events":            nil,
	"cdc_outbox_inflight_bytes":             nil,
	"cdc_outbox_slot_retained_wal_bytes":    nil,
	"cdc_outbox_slot_active":                nil,
	"cdc_outbox_slot_holder":                nil,
	"cdc_outbox_slot_wal_status":            {"status"},
	"cdc_outbox_slot_failover_standby":      {"standby", "state"},
	"cdc_outbox_standby_slots_blocking":     nil,
	"cdc_outbox_history_epoch":              nil,
	"cdc_outbox_lost_history_total":         nil,
	"cdc_outbox_connected":                  {"target"},
	"cdc_outbox_reconnects_total":           {"target"},
	"cdc_outbox_status_updates_total":       nil,
	"cdc_outbox_ready":                      nil,
	"cdc_outbox_build_info":                 {"version", "revision", "goversion"},

	"cdc_outbox_schema_registry_requests_total":  {"op", "result"},
	"cdc_outbox_schema_registry_request_seconds": {"op"}, // histogram
	"cdc_outbox_schema_encode_failures_total":    {"outbox", "reason"},
	"cdc_outbox_schema_registry_waiting":         nil,
	"cdc_outbox_schema_info":                     {"outbox", "registry", "subject", "schema_id", "version"},
	// A stream split over several slots (--shards), per shard's slot.
	"cdc_outbox_shard_slot_retained_wal_bytes": {"slot"},
	"cdc_outbox_shard_slot_active":             {"slot"},
	"cdc_outbox_shard_replication_lag_bytes":   {"slot"},
}

var histograms = map[string]bool{"cdc_outbox_end_to_end_latency_seconds": true, "cdc_outbox_receive_latency_seconds": true,
	"cdc_outbox_schema_registry_request_seconds": true}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"job", "instance"}

// metricName returns the contract metric that name is, or is a series of
// (histogram _bucket, _sum, _count), and whether there is one. up is
// Prometheus's own.
func metricName(name string) (string, bool) {
	if name == "up" {
		return name, true
	}
	if _, ok := contract[name]; ok && !histograms[name] {
		return name, true
	}
	for h := range histograms {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if name == h+suffix {
				return h, true
			}
		}
	}
	return "", false
}

// knownLabel says whether a label can appear on some metric that an
// expression uses.
func knownLabel(name string) bool {
	if slices.Contains(targetLabels, name) || name == "le" || name == "__name__" {
		return true
	}
	for _, labels := range contract {
		if slices.Contains(labels, name) {
			return true
		}
	}
	return false
}

// ------------------------------------------------------------- promtool

var promtool struct {
	once  sync.Once
	path  string
	err   error
	built time.Duration
}

// promtoolPath returns a promtool binary, building it the first time. Under
// -short it skips rather than build.
func promtoolPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	root, err := filepath.Abs("..") // the checkout: go test runs in deploy/
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, ".local", "promtool", promtoolVersion+"-"+runtime.GOOS+"-"+runtime.GOARCH)
	bin := filepath.Join(dir, "promtool")
	if _, err := os.Stat(bin); err != nil && testing.Short() {
		t.Skipf("-short: promtool %s is not built yet (%s), and building it takes minutes on a cold Go cache; run without -short once", promtoolVersion, bin)
	}
	promtool.once.Do(func() {
		if _, err := os.Stat(bin); err == nil {
			promtool.path = bin
			return
		}
		start := time.Now()
		promtool.err = installPromtool(t, dir, bin)
		promtool.built = time.Since(start)
		promtool.path = bin
	})
	if promtool.err != nil {
		t.Fatal(promtool.err)
	}
	if promtool.built > 0 {
		t.Logf("built promtool %s in %s (cached in %s)", promtoolVersion, promtool.built.Round(time.Second), bin)
	}
	return promtool.path
}

// installPromtool runs `go install` into a fresh directory beside bin and
// renames the result into place, so that concurrent test processes never see
// a half-written binary.
func installPromtool(t *testing.T, dir, bin string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	ctx := context.Background()
	if deadline, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-10*time.Second))
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, "go", "install", promtoolPackage+"@"+promtoolVersion)
	// GOFLAGS such as -mod=vendor do not apply to pkg@version installs;
	// GOWORK would make `go install pkg@version` refuse to run.
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return fmt.Errorf("building promtool %s did not finish before the test deadline (what was compiled is in the Go build cache, so the next run gets further): "+
			"run `go test -timeout 30m ./deploy/` once, after which the binary is cached, or set PROMTOOL to a promtool binary\n%s", promtoolVersion, out)
	}
	if err != nil {
		return fmt.Errorf("go install %s@%s: %v\n%s", promtoolPackage, promtoolVersion, err, out)
	}
	return os.Rename(filepath.Join(tmp, "promtool"), bin)
}

// runPromtool runs promtool with args in this directory and fails the test,
// with promtool's output, unless it exits 0.
func runPromtool(t *testing.T, args ...string) string {
	t.Helper()
	bin := promtoolPath(t)
	start := time.Now()
	cmd := exec.Command(bin, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("promtool %s (%s):\n%s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond), bytes.TrimSpace(out))
	return string(out)
}

func TestPromtoolCheckRules(t *testing.T) {
	t.Parallel()
	out := runPromtool(t, "check", "rules", "--lint=all", "--lint-fatal", alertsFile)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules did not say SUCCESS:\n%s", out)
	}
}

func TestPromtoolTestRules(t *testing.T) {
	t.Parallel()
	// The test file names alerts.yml relative to itself.
	out := runPromtool(t, "test", "rules", alertsTestFile)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules did not say SUCCESS:\n%s", out)
	}
}

func TestPromtoolCheckConfig(t *testing.T) {
	t.Parallel()
	out := runPromtool(t, "check", "config", "--lint=all", "--lint-fatal", configFile)
	if !strings.Contains(out, "1 rule files found") {
		t.Errorf("prometheus.yml should load exactly alerts.yml:\n%s", out)
	}
}

// ------------------------------------------------------ PromQL scanning

var (
	reString    = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	reMatchers  = regexp.MustCompile(`\{[^{}]*\}`)
	reMatcher   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	reRange     = regexp.MustCompile(`\[[^\]]*\]`)
	reGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)`)
	reVariable  = regexp.MustCompile(`\$\{[^}]*\}|\$\w+`)
	reNumber    = regexp.MustCompile(`\b(?:0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:ms|s|m|h|d|w|y)?)\b|\.\d+\b`)
	reIdent     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	reLegendVar = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
)

// promqlFunctions are the functions and aggregations the assets may use;
// add to it when a panel or rule needs another.
var promqlFunctions = map[string]bool{
	"abs": true, "absent": true, "absent_over_time": true, "avg": true, "avg_over_time": true,
	"bottomk": true, "ceil": true, "changes": true, "clamp_max": true, "clamp_min": true,
	"count": true, "count_over_time": true, "delta": true, "deriv": true, "floor": true,
	"group": true, "histogram_quantile": true, "idelta": true, "increase": true, "irate": true,
	"label_replace": true, "last_over_time": true, "max": true, "max_over_time": true,
	"min": true, "min_over_time": true, "predict_linear": true, "quantile_over_time": true,
	"rate": true, "resets": true, "round": true, "scalar": true, "sort": true, "sort_desc": true,
	"sum": true, "sum_over_time": true, "time": true, "timestamp": true, "topk": true, "vector": true,
}

var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"Inf": true, "NaN": true, "inf": true, "nan": true,
}

// scanExpr returns the metric names an expression selects and every problem
// found: names outside the contract, unknown functions, unknown labels.
func scanExpr(expr string) (metrics []string, problems []string) {
	s := reString.ReplaceAllString(expr, `""`)
	for _, m := range reMatchers.FindAllString(s, -1) {
		for _, l := range reMatcher.FindAllStringSubmatch(m, -1) {
			if !knownLabel(l[1]) {
				problems = append(problems, fmt.Sprintf("unknown label %q in %s", l[1], m))
			}
		}
	}
	s = reMatchers.ReplaceAllString(s, " ")
	s = reRange.ReplaceAllString(s, " ")
	for _, g := range reGrouping.FindAllStringSubmatch(s, -1) {
		for _, l := range strings.Split(g[2], ",") {
			if l = strings.TrimSpace(l); l != "" && !knownLabel(l) {
				problems = append(problems, fmt.Sprintf("unknown label %q in %s", l, g[0]))
			}
		}
	}
	s = reGrouping.ReplaceAllString(s, " ")
	s = reVariable.ReplaceAllString(s, " ")
	s = reNumber.ReplaceAllString(s, " ")
	for _, loc := range reIdent.FindAllStringIndex(s, -1) {
		id := s[loc[0]:loc[1]]
		call := strings.HasPrefix(strings.TrimLeft(s[loc[1]:], " \t\n"), "(")
		switch {
		case promqlKeywords[id]:
		case call:
			if !promqlFunctions[id] {
				problems = append(problems, fmt.Sprintf("unknown function %s()", id))
			}
		default:
			if m, ok := metricName(id); ok {
				metrics = append(metrics, m)
			} else {
				problems = append(problems, fmt.Sprintf("metric %q is not in the contract", id))
			}
		}
	}
	if len(metrics) == 0 {
		problems = append(problems, "selects no metric")
	}
	return metrics, problems
}

func TestScanExprCatchesTypos(t *testing.T) {
	t.Parallel()
	for expr, want := range map[string]string{
		`cdc_outbox_lag_secnds > 60`:                                                      "not in the contract",
		`sum by (topic) (rate(cdc_outbox_event_total[5m]))`:                               "not in the contract",
		`sum by (topik) (rate(cdc_outbox_events_total[5m]))`:                              "unknown label",
		`cdc_outbox_connected{targt="kafka"}`:                                             "unknown label",
		`histogram_quantil(0.99, rate(cdc_outbox_end_to_end_latency_seconds_bucket[5m]))`: "unknown function",
		`rate(cdc_outbox_end_to_end_latency_seconds_buckets[5m])`:                         "not in the contract",
		`1 + 2`: "selects no metric",
	} {
		if _, problems := scanExpr(expr); !strings.Contains(strings.Join(problems, "\n"), want) {
			t.Errorf("scanExpr(%q) = %q, want a problem containing %q", expr, problems, want)
		}
	}
	metrics, problems := scanExpr(`histogram_quantile(0.999, sum by (le) (rate(cdc_outbox_end_to_end_latency_seconds_bucket{job=~"$job", instance=~"$instance"}[$__rate_interval]))) > 1e-3 * 4 offset 5m or absent(up{job="cdc-outbox"})`)
	if len(problems) > 0 || !slices.Equal(metrics, []string{"cdc_outbox_end_to_end_latency_seconds", "up"}) {
		t.Errorf("scanExpr of a valid expression: metrics %q, problems %q", metrics, problems)
	}
}

// ------------------------------------------------------------ the rules

type rule struct {
	alert string
	expr  string
	line  int
}

// readRules reads the alerts of alerts.yml. It is not a YAML parser: it
// knows the file's layout (`- alert: Name`, then `expr: ...` on one line or
// as a block scalar `expr: |`), and promtool checks the file for real.
func readRules(t *testing.T) []rule {
	t.Helper()
	lines := readLines(t, alertsFile)
	var rules []rule
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "- alert:"); ok {
			rules = append(rules, rule{alert: strings.TrimSpace(name), line: i + 1})
			continue
		}
		trimmed := strings.TrimSpace(line)
		value, ok := strings.CutPrefix(trimmed, "expr:")
		if !ok || len(rules) == 0 {
			continue
		}
		value = strings.TrimSpace(value)
		if strings.HasPrefix(value, "|") || strings.HasPrefix(value, ">") {
			indent := len(line) - len(strings.TrimLeft(line, " "))
			var block []string
			for i+1 < len(lines) {
				next := lines[i+1]
				if strings.TrimSpace(next) != "" && len(next)-len(strings.TrimLeft(next, " ")) <= indent {
					break
				}
				block = append(block, next)
				i++
			}
			value = strings.Join(block, "\n")
		} else {
			value = strings.Trim(value, `'"`)
		}
		rules[len(rules)-1].expr = value
	}
	if len(rules) == 0 {
		t.Fatalf("%s: no alerts found", alertsFile)
	}
	for _, r := range rules {
		if strings.TrimSpace(r.expr) == "" {
			t.Errorf("%s:%d: alert %s: no expr found", alertsFile, r.line, r.alert)
		}
	}
	return rules
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// requiredAlerts are the alerts operators were promised.
var requiredAlerts = []string{
	"CdcOutboxLagHigh", "CdcOutboxRetainedWALHigh", "CdcOutboxRetainedWALGrowing",
	"CdcOutboxSlotInactive", "CdcOutboxSlotWALLost", "CdcOutboxDown", "CdcOutboxNotReady",
	"CdcOutboxBadEvents", "CdcOutboxStandbySlotsBlocking", "CdcOutboxFailoverNotReady", "CdcOutboxLostHistory",
}

func TestAlertsUseContractMetrics(t *testing.T) {
	t.Parallel()
	rules := readRules(t)
	var names []string
	for _, r := range rules {
		names = append(names, r.alert)
		_, problems := scanExpr(r.expr)
		for _, p := range problems {
			t.Errorf("%s:%d: alert %s: %s", alertsFile, r.line, r.alert, p)
		}
	}
	for _, want := range requiredAlerts {
		if !slices.Contains(names, want) {
			t.Errorf("%s: alert %s is missing", alertsFile, want)
		}
	}
	text, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(text), "- name: cdc-outbox\n") {
		t.Errorf("%s: the rule group should be called cdc-outbox", alertsFile)
	}
}

// TestEveryAlertIsTested checks that alerts_test.yml has, for every alert,
// a case where it fires and a case where it must not. promtool then proves
// both.
func TestEveryAlertIsTested(t *testing.T) {
	t.Parallel()
	fires, silent := map[string]int{}, map[string]int{}
	current := ""
	for i, line := range readLines(t, alertsTestFile) {
		s := strings.TrimSpace(line)
		if name, ok := strings.CutPrefix(s, "alertname:"); ok {
			current = strings.TrimSpace(name)
			continue
		}
		rest, ok := strings.CutPrefix(s, "exp_alerts:")
		if !ok {
			continue
		}
		if current == "" {
			t.Fatalf("%s:%d: exp_alerts without alertname", alertsTestFile, i+1)
		}
		if strings.TrimSpace(rest) == "[]" {
			silent[current]++
		} else {
			fires[current]++
		}
		current = ""
	}
	for _, r := range readRules(t) {
		if fires[r.alert] == 0 {
			t.Errorf("%s: no test case where %s fires", alertsTestFile, r.alert)
		}
		if silent[r.alert] == 0 {
			t.Errorf("%s: no test case where %s must not fire", alertsTestFile, r.alert)
		}
	}
}

// --------------------------------------------------------- the dashboard

type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasource     `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    struct{ H, W, X, Y int }
	Targets    []struct {
		Expr         string      `json:"expr"`
		LegendFormat string      `json:"legendFormat"`
		RefID        string      `json:"refId"`
		Datasource   *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// panels returns every panel, including those inside collapsed rows.
func (d dashboard) panels() []panel {
	var all []panel
	for _, p := range d.Panels {
		all = append(all, p)
		all = append(all, p.Panels...)
	}
	return all
}

func TestDashboardStructure(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	if d.UID != "cdc-outbox" {
		t.Errorf("uid = %q, want cdc-outbox", d.UID)
	}
	if d.SchemaVersion < 36 || d.SchemaVersion > 41 {
		t.Errorf("schemaVersion = %d, want about 39", d.SchemaVersion)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Name == "datasource" && (v.Type != "datasource" || string(v.Query) != `"prometheus"`) {
			t.Errorf("variable datasource: type %q query %s, want a prometheus data source variable", v.Type, v.Query)
		}
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
			t.Errorf("variable %s does not query ${datasource}", v.Name)
		}
	}
	if !vars["datasource"] {
		t.Error("no datasource variable")
	}
	ids := map[int]string{}
	firstData := ""
	for _, p := range d.panels() {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.GridPos.X < 0 || p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H <= 0 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if firstData == "" {
			firstData = p.Title
			if len(p.Targets) == 0 || !strings.Contains(p.Targets[0].Expr, "cdc_outbox_slot_") {
				t.Errorf("the first panel, %q, should show the replication slot", p.Title)
			}
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want uid ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if q.Datasource == nil || q.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q query %s: datasource %+v, want uid ${datasource}", p.Title, q.RefID, q.Datasource)
			}
			if refs[q.RefID] {
				t.Errorf("panel %q: refId %q twice", p.Title, q.RefID)
			}
			refs[q.RefID] = true
			for _, v := range reVariable.FindAllString(q.Expr, -1) {
				name := strings.Trim(v, "${}")
				if !vars[name] && !strings.HasPrefix(name, "__") {
					t.Errorf("panel %q: query uses undefined variable %s", p.Title, v)
				}
			}
		}
	}
}

func TestDashboardUsesContractMetrics(t *testing.T) {
	t.Parallel()
	for _, p := range readDashboard(t).panels() {
		for _, q := range p.Targets {
			_, problems := scanExpr(q.Expr)
			for _, problem := range problems {
				t.Errorf("panel %q query %s: %s\n\t%s", p.Title, q.RefID, problem, q.Expr)
			}
			for _, m := range reLegendVar.FindAllStringSubmatch(q.LegendFormat, -1) {
				if !knownLabel(m[1]) {
					t.Errorf("panel %q query %s: legend uses unknown label %q", p.Title, q.RefID, m[1])
				}
			}
		}
	}
}

// TestContractCovered checks that every exported metric is shown on the
// dashboard, and that the ones that page are also alerted on.
func TestContractCovered(t *testing.T) {
	t.Parallel()
	onDashboard := map[string]bool{}
	for _, p := range readDashboard(t).panels() {
		for _, q := range p.Targets {
			metrics, _ := scanExpr(q.Expr)
			for _, m := range metrics {
				onDashboard[m] = true
			}
		}
	}
	alerted := map[string]bool{}
	for _, r := range readRules(t) {
		metrics, _ := scanExpr(r.expr)
		for _, m := range metrics {
			alerted[m] = true
		}
	}
	var names []string
	for name := range contract {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range append(names, "up") {
		if !onDashboard[name] {
			t.Errorf("%s is on no dashboard panel", name)
		}
	}
	for _, name := range []string{
		"up", "cdc_outbox_lag_seconds", "cdc_outbox_slot_retained_wal_bytes", "cdc_outbox_slot_active",
		"cdc_outbox_slot_wal_status", "cdc_outbox_ready", "cdc_outbox_bad_events_total",
		"cdc_outbox_publish_errors_total", "cdc_outbox_standby_slots_blocking", "cdc_outbox_slot_failover_standby",
		"cdc_outbox_history_epoch", "cdc_outbox_lost_history_total", "cdc_outbox_schema_registry_waiting",
	} {
		if !alerted[name] {
			t.Errorf("%s is in no alert", name)
		}
	}
}

// ---------------------------------------------------------- provisioning

func TestGrafanaProvisioning(t *testing.T) {
	t.Parallel()
	for file, wants := range map[string][]string{
		datasourceFile: {"apiVersion: 1", "type: prometheus", "url: http://prometheus:9090"},
		providerFile:   {"apiVersion: 1", "type: file", "path: /var/lib/grafana/dashboards"},
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Error(err)
			continue
		}
		if bytes.Contains(b, []byte("\t")) {
			t.Errorf("%s: YAML must not contain tabs", file)
		}
		for _, want := range wants {
			if !bytes.Contains(b, []byte(want)) {
				t.Errorf("%s: %q missing", file, want)
			}
		}
	}
	// The provider loads *.json from the directory the dashboard sits in.
	if _, err := os.Stat(dashboardFile); errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s missing", dashboardFile)
	}
}
