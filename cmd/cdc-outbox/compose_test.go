package main

// Consistency checks for docker-compose.yml, the Dockerfile and the files
// they use, without Docker: the compose file must name real flags, mount
// files that exist, and agree with the code's defaults, the Prometheus
// configuration and the Grafana provisioning under deploy/.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const repoRoot = "../.."

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string `yaml:"image"`
	Build       any    `yaml:"build"`
	Command     any    `yaml:"command"`     // a string or a list
	Environment any    `yaml:"environment"` // a mapping or a list of K=V
	Volumes     []any  `yaml:"volumes"`     // short "src:dst[:ro]" or long {source, target}
	Ports       []any  `yaml:"ports"`
	DependsOn   any    `yaml:"depends_on"` // a list or a mapping with conditions
	Healthcheck *struct {
		Test    any  `yaml:"test"`
		Disable bool `yaml:"disable"`
	} `yaml:"healthcheck"`
}

func readCompose(t *testing.T) (composeFile, []byte) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c, data
}

func (c composeFile) service(t *testing.T, name string) composeService {
	t.Helper()
	s, ok := c.Services[name]
	if !ok {
		t.Fatalf("docker-compose.yml has no service %q", name)
	}
	return s
}

// env is a service's environment as a map.
func (s composeService) env() map[string]string {
	out := map[string]string{}
	switch e := s.Environment.(type) {
	case map[string]any:
		for k, v := range e {
			out[k] = fmt.Sprint(v)
		}
	case []any:
		for _, kv := range e {
			k, v, _ := strings.Cut(fmt.Sprint(kv), "=")
			out[k] = v
		}
	}
	return out
}

// words is a command or healthcheck test as a list of words.
func words(v any) []string {
	switch v := v.(type) {
	case string:
		return strings.Fields(v)
	case []any:
		var out []string
		for _, w := range v {
			out = append(out, fmt.Sprint(w))
		}
		return out
	}
	return nil
}

type mount struct{ source, target string }

// mounts is a service's volumes, short or long syntax.
func (s composeService) mounts() []mount {
	var out []mount
	for _, v := range s.Volumes {
		switch v := v.(type) {
		case string:
			parts := strings.Split(v, ":")
			if len(parts) >= 2 {
				out = append(out, mount{parts[0], parts[1]})
			}
		case map[string]any:
			out = append(out, mount{fmt.Sprint(v["source"]), fmt.Sprint(v["target"])})
		}
	}
	return out
}

// hostFile is the repository file mounted at target, "" when none is.
func (s composeService) hostFile(target string) string {
	for _, m := range s.mounts() {
		if m.target == target && strings.HasPrefix(m.source, ".") {
			return filepath.Join(repoRoot, m.source)
		}
	}
	return ""
}

// defaultOf is a run flag's default.
func defaultOf(t *testing.T, name string) string {
	t.Helper()
	var c runConfig
	fl := runFlags(&c).fs.Lookup(name)
	if fl == nil {
		t.Fatalf("no run flag --%s", name)
	}
	return fl.DefValue
}

// pinned reports whether image names a specific version: a tag that is not
// latest and has a digit, or a digest.
func pinned(image string) bool {
	if strings.Contains(image, "@sha256:") {
		return true
	}
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		return false // no tag (a registry port is not one)
	}
	tag := image[i+1:]
	return tag != "latest" && strings.ContainsAny(tag, "0123456789")
}

func TestPinned(t *testing.T) {
	for image, want := range map[string]bool{
		"postgres:15.18": true, "prom/prometheus:v3.16.0": true, "gcr.io/distroless/static-debian12:nonroot": false,
		"postgres": false, "postgres:latest": false, "registry:5000/x": false, "x@sha256:abc": true,
	} {
		if got := pinned(image); got != want {
			t.Errorf("pinned(%q) = %v", image, got)
		}
	}
}

func TestComposeServicesAndImages(t *testing.T) {
	c, _ := readCompose(t)
	for _, name := range []string{"postgres", "kafka", "cdc-outbox", "prometheus", "grafana"} {
		c.service(t, name)
	}
	for name, s := range c.Services {
		switch {
		case s.Image != "" && !pinned(s.Image):
			t.Errorf("service %s: image %q is not pinned to a version", name, s.Image)
		case s.Image == "" && s.Build == nil:
			t.Errorf("service %s has neither image nor build", name)
		}
	}
	if s := c.service(t, "cdc-outbox"); s.Build == nil {
		t.Error("service cdc-outbox must be built from the Dockerfile (build: .)")
	}
}

// TestComposeEnvironmentIsFlags: every CDC_OUTBOX_* variable the compose
// file mentions, set or in a comment, is a flag's.
func TestComposeEnvironmentIsFlags(t *testing.T) {
	c, data := readCompose(t)
	valid := map[string]bool{envName(configFlag): true}
	var rc runConfig
	for _, name := range runFlags(&rc).order {
		valid[envName(name)] = true
	}
	for name, s := range c.Services {
		for k := range s.env() {
			if strings.HasPrefix(k, "CDC_OUTBOX_") && !valid[k] {
				t.Errorf("service %s sets %s, which is no flag's variable", name, k)
			}
		}
	}
	for _, k := range regexp.MustCompile(`CDC_OUTBOX_[A-Z0-9_]+`).FindAllString(string(data), -1) {
		if !valid[k] {
			t.Errorf("docker-compose.yml mentions %s, which is no flag's variable", k)
		}
	}
}

// TestComposeWiring: cdc-outbox reaches the postgres and kafka services by
// name, after they are healthy, with the scripts' and the code's names.
func TestComposeWiring(t *testing.T) {
	c, _ := readCompose(t)
	s := c.service(t, "cdc-outbox")
	env := s.env()

	u, err := url.Parse(env["CDC_OUTBOX_POSTGRES_URL"])
	if err != nil || u.Hostname() != "postgres" || u.Port() != "5432" || u.Path != "/postgres" || u.User.Username() != "postgres" {
		t.Errorf("CDC_OUTBOX_POSTGRES_URL %q: want postgres://postgres@postgres:5432/postgres...", env["CDC_OUTBOX_POSTGRES_URL"])
	}
	if _, has := u.User.Password(); has {
		t.Errorf("CDC_OUTBOX_POSTGRES_URL has a password: give it as PGPASSWORD, as docs/getting-started.md recommends")
	}
	if env["PGPASSWORD"] != c.service(t, "postgres").env()["POSTGRES_PASSWORD"] {
		t.Errorf("cdc-outbox's PGPASSWORD %q is not the postgres service's POSTGRES_PASSWORD", env["PGPASSWORD"])
	}

	brokers := env["CDC_OUTBOX_KAFKA_BROKERS"]
	host, _, err := net.SplitHostPort(brokers)
	if err != nil || host != "kafka" {
		t.Errorf("CDC_OUTBOX_KAFKA_BROKERS %q: want the kafka service's internal listener, kafka:<port>", brokers)
	}
	if adv := c.service(t, "kafka").env()["KAFKA_ADVERTISED_LISTENERS"]; !strings.Contains(adv, "://"+brokers) {
		t.Errorf("CDC_OUTBOX_KAFKA_BROKERS %q is not among kafka's advertised listeners %q", brokers, adv)
	}

	deps, ok := s.DependsOn.(map[string]any)
	if !ok {
		t.Fatalf("cdc-outbox depends_on %v: want a mapping with condition: service_healthy", s.DependsOn)
	}
	for _, dep := range []string{"postgres", "kafka"} {
		cond, _ := deps[dep].(map[string]any)
		if cond["condition"] != "service_healthy" {
			t.Errorf("cdc-outbox must wait for %s with condition: service_healthy, has %v", dep, deps[dep])
		}
		if hc := c.service(t, dep).Healthcheck; hc == nil || hc.Disable || len(words(hc.Test)) == 0 {
			t.Errorf("service %s has no healthcheck, so service_healthy never comes", dep)
		}
	}
	if cmd := words(s.Command); cmd != nil && (len(cmd) == 0 || cmd[0] != "run") {
		t.Errorf("cdc-outbox command %v: want run", cmd)
	}
	if !slices.ContainsFunc(s.Ports, func(p any) bool { return strings.HasSuffix(fmt.Sprint(p), ":"+httpPort(t, env)) }) {
		t.Errorf("cdc-outbox ports %v do not publish the HTTP port %s", s.Ports, httpPort(t, env))
	}
}

// httpPort is the port cdc-outbox serves HTTP on in compose: its
// CDC_OUTBOX_HTTP_ADDR, else the flag's default.
func httpPort(t *testing.T, env map[string]string) string {
	t.Helper()
	addr, ok := env[envName("http-addr")]
	if !ok {
		addr = defaultOf(t, "http-addr")
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("http-addr %q: %v", addr, err)
	}
	return port
}

func TestComposePostgres(t *testing.T) {
	c, _ := readCompose(t)
	s := c.service(t, "postgres")
	cmd := strings.Join(words(s.Command), " ")
	if !strings.Contains(cmd, "-c wal_level=logical") {
		t.Errorf("postgres command %q does not set wal_level=logical", cmd)
	}
	var initSQL string
	for _, m := range s.mounts() {
		if m.source == "./sql/publication.sql" && strings.HasPrefix(m.target, "/docker-entrypoint-initdb.d/") && strings.HasSuffix(m.target, ".sql") {
			initSQL = filepath.Join(repoRoot, m.source)
		}
	}
	if initSQL == "" {
		t.Fatalf("postgres does not mount ./sql/publication.sql into /docker-entrypoint-initdb.d/: %v", s.mounts())
	}
	sql, err := os.ReadFile(initSQL)
	if err != nil {
		t.Fatal(err)
	}
	pub, table := defaultOf(t, "publication"), strings.TrimPrefix(defaultOf(t, "table"), "public.")
	if want := "CREATE PUBLICATION " + pub + " FOR TABLE " + table; !strings.Contains(string(sql), want) {
		t.Errorf("sql/publication.sql lacks %q, which the defaults of --publication and --table expect", want)
	}
	if u := s.env()["POSTGRES_USER"]; u != "" && u != "postgres" {
		t.Errorf("POSTGRES_USER %q: the scripts and the docs use postgres", u)
	}
}

// TestComposeKeepsKafkaWithPostgres: Kafka's topics live in a named
// volume, as PostgreSQL's data does: `docker compose down` and `up` keep
// both, so the slot's position never runs ahead of topics that were lost
// (events confirmed to PostgreSQL but gone from Kafka are never resent).
func TestComposeKeepsKafkaWithPostgres(t *testing.T) {
	c, _ := readCompose(t)
	for _, tc := range []struct{ service, dataDir string }{
		{"postgres", "/var/lib/postgresql/data"},
		{"kafka", c.service(t, "kafka").env()["KAFKA_LOG_DIRS"]},
	} {
		if tc.dataDir == "" {
			t.Errorf("%s: KAFKA_LOG_DIRS is not set: the topics are in the container's /tmp, lost by docker compose down", tc.service)
			continue
		}
		var volume string
		for _, m := range c.service(t, tc.service).mounts() {
			if _, named := c.Volumes[m.source]; named && m.target == tc.dataDir {
				volume = m.source
			}
		}
		if volume == "" {
			t.Errorf("%s keeps its data in %s, which is no named volume: %v", tc.service, tc.dataDir, c.service(t, tc.service).mounts())
		}
	}
	if c.service(t, "kafka").env()["CLUSTER_ID"] == "" {
		t.Error("kafka has no fixed CLUSTER_ID, so a new container may not take the volume's data for its own")
	}
}

// TestComposeMountsExist: every file or folder of the repository a service
// mounts is there.
func TestComposeMountsExist(t *testing.T) {
	c, _ := readCompose(t)
	for name, s := range c.Services {
		for _, m := range s.mounts() {
			if !strings.HasPrefix(m.source, ".") {
				if _, ok := c.Volumes[m.source]; !ok {
					t.Errorf("service %s mounts %q, which is no path in the repository nor a named volume", name, m.source)
				}
				continue
			}
			if _, err := os.Stat(filepath.Join(repoRoot, m.source)); err != nil {
				hint := ""
				if strings.HasPrefix(m.source, "./deploy/") {
					hint = " (deploy/ holds the Prometheus and Grafana assets; is it written yet?)"
				}
				t.Errorf("service %s mounts %s at %s, which does not exist%s", name, m.source, m.target, hint)
			}
		}
	}
}

// TestComposePrometheus: the mounted Prometheus configuration scrapes the
// cdc-outbox service on its HTTP port, and its rule files are mounted
// beside it.
func TestComposePrometheus(t *testing.T) {
	c, _ := readCompose(t)
	s := c.service(t, "prometheus")
	const confTarget = "/etc/prometheus/prometheus.yml"
	file := s.hostFile(confTarget)
	if file == "" {
		t.Fatalf("prometheus does not mount a repository file at %s: %v", confTarget, s.mounts())
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (deploy/ holds the Prometheus assets; is it written yet?)", err)
	}
	var conf struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(data, &conf); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	want := net.JoinHostPort("cdc-outbox", httpPort(t, c.service(t, "cdc-outbox").env()))
	var targets []string
	for _, sc := range conf.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	if !slices.Contains(targets, want) {
		t.Errorf("%s scrapes %v, not the cdc-outbox service at %s", file, targets, want)
	}
	for _, rf := range conf.RuleFiles {
		target := rf
		if !path.IsAbs(rf) {
			target = path.Join(path.Dir(confTarget), rf)
		}
		if s.hostFile(target) == "" {
			t.Errorf("%s loads rule file %s, but prometheus mounts nothing at %s", file, rf, target)
		}
	}
	if len(conf.RuleFiles) == 0 {
		t.Errorf("%s loads no rule files: the shipped alerts are not used", file)
	}
}

// TestComposeGrafana: Grafana gets the data source and dashboard provider,
// finds the dashboard where the provider looks, reaches Prometheus by its
// service name, and lets anonymous viewers in.
func TestComposeGrafana(t *testing.T) {
	c, _ := readCompose(t)
	s := c.service(t, "grafana")
	env := s.env()
	if env["GF_AUTH_ANONYMOUS_ENABLED"] != "true" || env["GF_AUTH_ANONYMOUS_ORG_ROLE"] != "Viewer" {
		t.Errorf("grafana: want anonymous Viewer access, environment %v", env)
	}
	mounted := map[string]string{} // target -> host path
	for _, m := range s.mounts() {
		if strings.HasPrefix(m.source, ".") {
			mounted[m.target] = filepath.Join(repoRoot, m.source)
		}
	}
	// hostPath maps a container path to the repository file mounted there.
	hostPath := func(p string) string {
		for target, host := range mounted {
			if p == target || strings.HasPrefix(p, target+"/") {
				return filepath.Join(host, strings.TrimPrefix(p, target))
			}
		}
		return ""
	}
	read := func(containerPath string) []byte {
		t.Helper()
		host := hostPath(containerPath)
		if host == "" {
			t.Fatalf("grafana mounts nothing at %s: %v", containerPath, mounted)
		}
		data, err := os.ReadFile(host)
		if err != nil {
			t.Fatalf("%v (deploy/ holds the Grafana assets; is it written yet?)", err)
		}
		return data
	}

	var ds struct {
		Datasources []struct {
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	if err := yaml.Unmarshal(read("/etc/grafana/provisioning/datasources/prometheus.yml"), &ds); err != nil {
		t.Fatal(err)
	}
	if len(ds.Datasources) == 0 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://prometheus:9090" {
		t.Errorf("grafana's data source %+v: want type prometheus at http://prometheus:9090, the prometheus service", ds.Datasources)
	}

	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	if err := yaml.Unmarshal(read("/etc/grafana/provisioning/dashboards/cdc-outbox.yml"), &prov); err != nil {
		t.Fatal(err)
	}
	if len(prov.Providers) == 0 {
		t.Fatal("no dashboard provider")
	}
	var dash struct {
		UID   string `json:"uid"`
		Title string `json:"title"`
	}
	dashPath := path.Join(prov.Providers[0].Options.Path, "cdc-outbox.json")
	if err := json.Unmarshal(read(dashPath), &dash); err != nil || dash.UID == "" {
		t.Errorf("%s: not a dashboard (uid %q): %v", dashPath, dash.UID, err)
	}
	if home := env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; home != "" && hostPath(home) == "" {
		t.Errorf("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH %s is not a mounted file", home)
	}
}

// dockerfile is the Dockerfile's instructions, continuation lines joined:
// [instruction, arguments].
func dockerfile(t *testing.T) [][2]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]string
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if rest, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(rest + " ")
			continue
		}
		cur.WriteString(line)
		instr, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, [2]string{strings.ToUpper(instr), strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

func TestDockerfile(t *testing.T) {
	instrs := dockerfile(t)
	var froms []string
	last := map[string]string{} // instruction -> arguments, in the final stage
	var buildLine string
	for _, in := range instrs {
		switch in[0] {
		case "FROM":
			froms = append(froms, strings.Fields(in[1])[0])
			last = map[string]string{}
		case "RUN":
			if strings.Contains(in[1], "go build") {
				buildLine = in[1]
			}
		}
		last[in[0]] = in[1]
	}
	if len(froms) < 2 {
		t.Fatalf("want a multi-stage build, FROM %v", froms)
	}
	builder, final := froms[0], froms[len(froms)-1]
	if !strings.HasPrefix(builder, "golang:1.26") || !pinned(builder) {
		t.Errorf("builder %q: want golang:1.26-..., the Go of go.mod", builder)
	}
	if !strings.HasPrefix(final, "gcr.io/distroless/static") {
		t.Errorf("final image %q: want gcr.io/distroless/static-*", final)
	}
	user := last["USER"]
	if !strings.HasSuffix(final, ":nonroot") && (user == "" || user == "root" || strings.HasPrefix(user, "0")) {
		t.Errorf("final image %q runs as root (USER %q)", final, user)
	}
	if user == "root" || strings.HasPrefix(user, "0") {
		t.Errorf("final stage sets USER %q", user)
	}
	jsonArgs := func(instr string) []string {
		var v []string
		if err := json.Unmarshal([]byte(last[instr]), &v); err != nil {
			t.Errorf("%s %s: want the exec (JSON) form: %v", instr, last[instr], err)
		}
		return v
	}
	if got := jsonArgs("ENTRYPOINT"); !slices.Equal(got, []string{"cdc-outbox"}) {
		t.Errorf(`ENTRYPOINT %v: want ["cdc-outbox"]`, got)
	}
	if got := jsonArgs("CMD"); !slices.Equal(got, []string{"run"}) {
		t.Errorf(`CMD %v: want ["run"]`, got)
	}
	if !strings.HasSuffix(last["COPY"], " /usr/local/bin/cdc-outbox") {
		t.Errorf("final stage COPY %q: want the binary at /usr/local/bin/cdc-outbox", last["COPY"])
	}
	if port := httpPort(t, nil); !slices.Contains(strings.Fields(last["EXPOSE"]), port) {
		t.Errorf("EXPOSE %q lacks the --http-addr port %s", last["EXPOSE"], port)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=${VERSION}", "-X main.revision=${REVISION}", "./cmd/cdc-outbox"} {
		if !strings.Contains(buildLine, want) {
			t.Errorf("the go build line lacks %q: %s", want, buildLine)
		}
	}
	_, _ = version, revision // the variables -X sets must exist

	ignore, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(ignore), "\n")
	for _, want := range []string{".git", ".local", "bin"} {
		if !slices.Contains(lines, want) {
			t.Errorf(".dockerignore lacks %s", want)
		}
	}
}
