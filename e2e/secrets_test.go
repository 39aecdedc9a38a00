package e2e

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestSecretsStayOutOfOutput runs the binary with a distinctive Kafka SASL
// password and a PostgreSQL URL with a distinctive password, given as
// flags, environment variables and in a configuration file, and looks for
// either in everything it prints: the log of a working stream (text, at
// debug level, so the Kafka client's own lines are in it too), the logs of
// a refused login, of an unreachable broker and of an unreachable
// PostgreSQL (text and json), configuration errors, --help, `status`
// (text, json, and unable to connect), and /metrics, /readyz and /healthz.
// The local PostgreSQL trusts local connections, so it ignores the URL's
// password; the Kafka user is made for the test with its password.
func TestSecretsStayOutOfOutput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	kafkaSecret := testenv.Name("KafkaSecret")
	pgSecret := testenv.Name("PgSecret")
	user := testenv.Name("secrets")
	scramUser(t, user, kafkaSecret)

	u, err := url.Parse(e.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), pgSecret)
	secretURL := u.String()
	unreachableURL := "postgres://postgres:" + pgSecret + "@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=5"

	// outputs collects everything printed, by what printed it.
	outputs := map[string]string{}
	sasl := func(password ...string) []string {
		args := []string{
			"--postgres-url", secretURL,
			"--kafka-brokers", strings.Join(testenv.KafkaSASLBrokers(t), ","),
			"--kafka-tls", "--kafka-tls-ca-file", testenv.KafkaCAFile(t),
			"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-username", user,
		}
		return append(args, password...)
	}

	// A working stream: the password as a flag, at debug level.
	s := e.start(append(sasl("--kafka-sasl-password", kafkaSecret), "--log-format", "text", "--log-level", "debug")...)
	e.waitStreaming()
	addr := s.httpAddr()
	eventually(t, 60*time.Second, "/readyz to answer 200", func() bool {
		code, _ := get(addr, "/readyz")
		return code == 200
	})
	wl := newWorkload(e)
	if err := wl.write(testenv.Context(t), 0, 50, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	if v, _ := wl.verify([]string{"payment"}, time.Minute); v.missing != 0 {
		t.Fatalf("verifier: %s", v)
	}
	// The consumer may see the events before the streamer's acks count
	// them: wait for the counter, so the body has every series.
	eventually(t, 30*time.Second, "/metrics to count the events", func() bool {
		_, outputs["working stream /metrics"] = get(addr, "/metrics")
		return strings.Contains(outputs["working stream /metrics"], "cdc_outbox_events_total{")
	})
	for _, path := range []string{"/readyz", "/healthz"} {
		_, outputs["working stream "+path] = get(addr, path)
	}
	s.stop()
	outputs["working stream, text log at debug level"] = s.logText()

	// Refused logins: a wrong password (containing the right one) from the
	// environment and from a flag, json and text; the refusal is logged
	// and in /readyz.
	wrong := kafkaSecret + "-wrong"
	for _, tc := range []struct {
		name    string
		environ []string
		args    []string
	}{
		{"wrong password from the environment, json log", []string{"CDC_OUTBOX_KAFKA_SASL_PASSWORD=" + wrong}, sasl()},
		{"wrong password from a flag, text log", nil, append(sasl("--kafka-sasl-password", wrong), "--log-format", "text")},
	} {
		s := e.startEnv(tc.environ, tc.args...)
		addr := s.httpAddr()
		eventually(t, 60*time.Second, tc.name+": the refusal in /readyz", func() bool {
			var code int
			code, outputs[tc.name+" /readyz"] = get(addr, "/readyz")
			return code == 503 && strings.Contains(outputs[tc.name+" /readyz"], "SASL authentication failed")
		})
		_, outputs[tc.name+" /metrics"] = get(addr, "/metrics")
		s.stop()
		outputs[tc.name+", log"] = s.logText()
		if !strings.Contains(outputs[tc.name+", log"], "SASL authentication failed") {
			t.Errorf("%s: the log does not say SASL authentication failed:\n%s", tc.name, outputs[tc.name+", log"])
		}
	}

	// An unreachable broker.
	s = e.start(append(sasl("--kafka-sasl-password", kafkaSecret), "--kafka-brokers", "127.0.0.1:1")...)
	eventually(t, 60*time.Second, "the unreachable broker in the log", func() bool {
		return strings.Contains(s.logText(), "Kafka does not answer")
	})
	s.stop()
	outputs["unreachable broker, json log"] = s.logText()

	// An unreachable PostgreSQL: run stops with an error.
	for _, format := range []string{"text", "json"} {
		out, code := runCLI(t, []string{"CDC_OUTBOX_KAFKA_SASL_PASSWORD=" + kafkaSecret}, "run", "--postgres-url", unreachableURL,
			"--kafka-brokers", strings.Join(testenv.KafkaSASLBrokers(t), ","), "--kafka-tls", "--kafka-tls-ca-file", testenv.KafkaCAFile(t),
			"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-username", user,
			"--http-addr", "127.0.0.1:0", "--log-format", format)
		if code != 1 || !strings.Contains(out, "stopped with an error") {
			t.Errorf("unreachable PostgreSQL (%s): exit %d, want 1 and the error:\n%s", format, code, out)
		}
		outputs["unreachable PostgreSQL, "+format+" log"] = out
	}

	// Configuration errors (exit 2).
	configFile := writeTemp(t, "cdc-outbox.yaml", "postgres-url: \""+secretURL+"\"\nkafka-sasl-password: "+kafkaSecret+"\nstatus-interval: soon\n")
	for _, tc := range []struct {
		name    string
		environ []string
		args    []string
		want    string
	}{
		{"password and password file", nil, sasl("--kafka-sasl-password", kafkaSecret, "--kafka-sasl-password-file", "/nonexistent"),
			"--kafka-sasl-password and --kafka-sasl-password-file are both set"},
		{"password without mechanism, from the environment",
			[]string{"CDC_OUTBOX_KAFKA_SASL_PASSWORD=" + kafkaSecret, "CDC_OUTBOX_POSTGRES_URL=" + secretURL}, nil,
			"--kafka-sasl-password (from CDC_OUTBOX_KAFKA_SASL_PASSWORD) given but --kafka-sasl-mechanism is none"},
		{"unparsable URL", nil, sasl("--kafka-sasl-password", kafkaSecret, "--postgres-url", "postgres://postgres:"+pgSecret+"@127.0.0.1:notaport/db"),
			"--postgres-url:"},
		{"missing password file", nil, sasl("--kafka-sasl-password-file", "/nonexistent/password"),
			"--kafka-sasl-password-file: open /nonexistent/"},
		{"configuration file", nil, []string{"--config", configFile}, "status-interval"},
	} {
		out, code := runCLI(t, tc.environ, append([]string{"run"}, tc.args...)...)
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, want 2 and %q:\n%s", tc.name, code, tc.want, out)
		}
		outputs["configuration error: "+tc.name] = out
	}

	// Help, with the secrets in the flags and the environment.
	secretEnv := []string{"CDC_OUTBOX_KAFKA_SASL_PASSWORD=" + kafkaSecret, "CDC_OUTBOX_POSTGRES_URL=" + secretURL}
	for _, args := range [][]string{
		append(append([]string{"run"}, sasl("--kafka-sasl-password", kafkaSecret)...), "--help"),
		{"status", "--postgres-url", secretURL, "--help"},
		{"help"},
	} {
		out, code := runCLI(t, secretEnv, args...)
		if code != 0 {
			t.Errorf("%v: exit %d:\n%s", args, code, out)
		}
		outputs[strings.Join(args[:1], " ")+" --help"] += out
	}

	// status: healthy (text and json, the URL as a flag and from the
	// environment) and unable to connect.
	for _, tc := range []struct {
		name    string
		environ []string
		args    []string
		code    int
	}{
		{"text", secretEnv, []string{"--postgres-url", secretURL}, 0},
		{"json, URL from the environment", secretEnv, []string{"--json"}, 0},
		{"unreachable, text", secretEnv, []string{"--postgres-url", unreachableURL}, 2},
		{"unreachable, json", secretEnv, []string{"--postgres-url", unreachableURL, "--json"}, 2},
		{"unparsable URL", secretEnv, []string{"--postgres-url", "postgres://postgres:" + pgSecret + "@127.0.0.1:notaport/db"}, 2},
	} {
		out, code := runCLI(t, tc.environ, append([]string{"status", "--slot", e.slot}, tc.args...)...)
		if code != tc.code {
			t.Errorf("status (%s): exit %d, want %d:\n%s", tc.name, code, tc.code, out)
		}
		outputs["status, "+tc.name] = out
	}

	for what, text := range outputs {
		for name, secret := range map[string]string{"Kafka SASL password": kafkaSecret, "PostgreSQL password": pgSecret} {
			if strings.Contains(text, secret) {
				t.Errorf("%s shows the %s:\n%s", what, name, text)
			}
		}
	}
	t.Logf("looked in %d outputs", len(outputs))
}

// scramUser creates a SCRAM-SHA-512 user on the test broker (through its
// PLAINTEXT listener's admin API) and deletes it at cleanup.
func scramUser(t *testing.T, user, password string) {
	t.Helper()
	adm := kadm.NewClient(testenv.KafkaClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: user, Mechanism: kadm.ScramSha512, Iterations: 4096, Password: password}})
	if err == nil {
		err = res[user].Err
	}
	if err != nil {
		t.Fatalf("create SCRAM user %s: %v", user, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.AlterUserSCRAMs(ctx, []kadm.DeleteSCRAM{{User: user, Mechanism: kadm.ScramSha512}}, nil)
	})
}
