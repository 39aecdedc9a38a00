package e2e

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestServersRecoverAPortTakenBeforeStart: the local servers' scripts
// choose a free port and the server binds it only later, so another
// program can take it in between (CI once failed so: Kafka's SASL_SSL port
// was given to an outgoing connection, the broker exited, and the script
// waited 90 s for it). Here the test takes the chosen port on purpose
// before the first start, and each start must recover: see that the
// server exited, start it again on new ports, and serve there. Each server
// runs in a state folder of the test's own (CDC_OUTBOX_LOCAL).
func TestServersRecoverAPortTakenBeforeStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL, a Kafka and a Jaeger of its own")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("postgres", func(t *testing.T) {
		pg := newScript(t, filepath.Join(root, "scripts/postgres.sh"))
		t.Cleanup(func() { pg.run(t, "destroy") })
		pg.must(t, "init")
		chosen := urlPort(t, pg.must(t, "url"))
		listen(t, chosen)

		_, stderr := pg.mustErr(t, "start")
		u := pg.must(t, "url")
		if urlPort(t, u) == chosen || !strings.Contains(stderr, "starting again on a new port") {
			t.Fatalf("postgres.sh start on taken port %s: now at %s; its stderr:\n%s", chosen, u, stderr)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatalf("connect to the recovered server at %s: %v", u, err)
		}
		conn.Close(ctx)

		// Once started, the port is known to clients and kept: a start
		// that loses it fails, and says what to do.
		pg.must(t, "stop")
		listen(t, urlPort(t, u))
		if out, err := pg.run(t, "start"); err == nil || !strings.Contains(out, "which clients already know") || !strings.Contains(out, "destroy") {
			t.Errorf("postgres.sh start on its own port, taken: %v, want a failure saying what to do:\n%s", err, out)
		}
	})

	t.Run("kafka", func(t *testing.T) {
		kafka := newScript(t, filepath.Join(root, "scripts/kafka.sh"))
		t.Cleanup(func() { kafka.run(t, "destroy") })
		sasl := kafka.must(t, "sasl-brokers")
		// As in CI: an outgoing connection holds the port as its own.
		connectFrom(t, addrPort(t, sasl))

		_, stderr := kafka.mustErr(t, "start")
		now := kafka.must(t, "sasl-brokers")
		if now == sasl || !strings.Contains(stderr, "starting again on new ports") {
			t.Fatalf("kafka.sh start with the SASL_SSL port %s taken: now at %s; its stderr:\n%s", sasl, now, stderr)
		}
		// The lost start was given up when the broker exited, not after
		// the 90 s of a broker slow to answer.
		if !strings.Contains(stderr, "exited before") {
			t.Errorf("kafka.sh did not see the broker exit; its stderr:\n%s", stderr)
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.must(t, "brokers")))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := kadm.NewClient(cl).BrokerMetadata(ctx); err != nil {
			t.Fatalf("metadata from the recovered broker: %v", err)
		}
	})

	t.Run("jaeger", func(t *testing.T) {
		jaeger := newScript(t, testenv.JaegerCtl(t))
		t.Cleanup(func() { jaeger.run(t, "stop") })
		jaeger.must(t, "configure")
		otlp := jaeger.must(t, "otlp-endpoint")
		listen(t, addrPort(t, otlp))

		_, stderr := jaeger.mustErr(t, "start")
		now := jaeger.must(t, "otlp-endpoint")
		if now == otlp || !strings.Contains(stderr, "starting again on new ports") {
			t.Fatalf("jaeger.sh start with the OTLP port of %s taken: now at %s; its stderr:\n%s", otlp, now, stderr)
		}
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(jaeger.must(t, "query-url") + "/api/services")
		if err != nil {
			t.Fatalf("query the recovered Jaeger: %v", err)
		}
		resp.Body.Close()
	})
}

// script is a server's control script run in a state folder of the
// test's own.
type script struct {
	path string
	env  []string
}

func newScript(t *testing.T, path string) script {
	return script{path: path, env: append(os.Environ(), "CDC_OUTBOX_LOCAL="+t.TempDir())}
}

// run runs the script with args and returns its output, stdout and stderr
// together.
func (s script) run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(s.path, args...)
	cmd.Env = s.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// must runs the script and returns its stdout, trimmed; it fails the test
// when the script fails.
func (s script) must(t *testing.T, args ...string) string {
	t.Helper()
	stdout, _ := s.mustErr(t, args...)
	return strings.TrimSpace(stdout)
}

// mustErr is must with stdout and stderr apart.
func (s script) mustErr(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(s.path, args...)
	cmd.Env = s.env
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", s.path, strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String(), errOut.String()
}

// urlPort is the port of a postgres:// URL.
func urlPort(t *testing.T, s string) string {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u.Port()
}

// addrPort is the port of host:port or of an http:// URL.
func addrPort(t *testing.T, s string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(strings.TrimPrefix(s, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// listen takes port by listening on it until the test ends.
func listen(t *testing.T, port string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatalf("take port %s: %v", port, err)
	}
	t.Cleanup(func() { ln.Close() })
}

// connectFrom takes port as an outgoing connection's local port would,
// until the test ends: a connection from 127.0.0.1:port to a listener of
// the test's.
func connectFrom(t *testing.T, port string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	local, err := net.ResolveTCPAddr("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := (&net.Dialer{LocalAddr: local, Timeout: 10 * time.Second}).Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("connect from port %s: %v", port, err)
	}
	t.Cleanup(func() { conn.Close() })
}
