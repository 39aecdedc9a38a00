// Package modules checks the layout of the repository's Go modules: the
// libraries services import (outbox, outboxschema, idempotency, consume,
// consumeprom, consumeotel, consumeschema, schema) are modules of their own, so that importing one costs a service only that
// library's dependencies.
package modules_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/consume"
	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

const root = "../.."

// libraries are the library modules: directory, module path, and the
// packages a service imports from it.
var libraries = []struct {
	dir, path string
	imports   []string
}{
	{"outbox", "github.com/cdc-outbox/cdc-outbox/outbox", []string{"github.com/cdc-outbox/cdc-outbox/outbox", "github.com/cdc-outbox/cdc-outbox/outbox/topic", "github.com/cdc-outbox/cdc-outbox/outbox/contract"}},
	{"idempotency", "github.com/cdc-outbox/cdc-outbox/idempotency", []string{"github.com/cdc-outbox/cdc-outbox/idempotency"}},
	{"consume", "github.com/cdc-outbox/cdc-outbox/consume", []string{"github.com/cdc-outbox/cdc-outbox/consume"}},
	{"consume/consumeprom", "github.com/cdc-outbox/cdc-outbox/consume/consumeprom", []string{"github.com/cdc-outbox/cdc-outbox/consume/consumeprom"}},
	{"consume/consumeotel", "github.com/cdc-outbox/cdc-outbox/consume/consumeotel", []string{"github.com/cdc-outbox/cdc-outbox/consume/consumeotel"}},
	{"schema", "github.com/cdc-outbox/cdc-outbox/schema", []string{"github.com/cdc-outbox/cdc-outbox/schema"}},
	{"outbox/outboxschema", "github.com/cdc-outbox/cdc-outbox/outbox/outboxschema", []string{"github.com/cdc-outbox/cdc-outbox/outbox/outboxschema"}},
	{"consume/consumeschema", "github.com/cdc-outbox/cdc-outbox/consume/consumeschema", []string{"github.com/cdc-outbox/cdc-outbox/consume/consumeschema"}},
}

// forbidden are module path prefixes that must not be in the module graph
// of a service importing the library: the streamer's dependencies (and the
// streamer's own module), and Prometheus and OpenTelemetry where they are not
// the point.
var forbidden = map[string][]string{
	"outbox":              {"github.com/twmb/", "github.com/prometheus/", "go.opentelemetry.io/", "github.com/jackc/pglogrepl", "go.yaml.in/", "github.com/cdc-outbox/cdc-outbox "},
	"idempotency":         {"github.com/twmb/", "github.com/prometheus/", "github.com/jackc/pglogrepl", "go.yaml.in/", "github.com/cdc-outbox/cdc-outbox "},
	"consume":             {"github.com/prometheus/", "go.opentelemetry.io/", "github.com/jackc/pglogrepl", "github.com/cdc-outbox/cdc-outbox "},
	"consume/consumeprom": {"github.com/jackc/pglogrepl", "github.com/cdc-outbox/cdc-outbox "},
	"consume/consumeotel": {"github.com/prometheus/", "github.com/jackc/pglogrepl", "github.com/cdc-outbox/cdc-outbox "},
	// The encoders need the registry client (franz-go's pkg/sr), not its
	// Kafka client ("github.com/twmb/franz-go ", the module itself), nor a
	// database.
	"schema": {"github.com/twmb/franz-go ", "github.com/jackc/", "github.com/prometheus/", "go.opentelemetry.io/", "go.yaml.in/", "github.com/cdc-outbox/cdc-outbox "},
	// The write-side check: outbox's pgx and schema's libraries, no Kafka
	// client.
	"outbox/outboxschema":   {"github.com/twmb/franz-go ", "github.com/prometheus/", "go.opentelemetry.io/", "github.com/jackc/pglogrepl", "go.yaml.in/", "github.com/cdc-outbox/cdc-outbox "},
	"consume/consumeschema": {"github.com/prometheus/", "go.opentelemetry.io/", "github.com/jackc/pglogrepl", "github.com/cdc-outbox/cdc-outbox "},
}

// TestServiceModuleGraphs builds, for each library, a throwaway service
// module that imports it (the libraries replaced by this checkout, as a
// released version would be fetched), and checks its whole module graph
// (go list -m all) for modules it must not pull in: a service that only
// writes outbox rows gets pgx and nothing else.
func TestServiceModuleGraphs(t *testing.T) {
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, lib := range libraries {
		t.Run(lib.dir, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			var mod strings.Builder
			mod.WriteString("module example.com/service\n\ngo 1.26.0\n\n")
			for _, l := range libraries {
				mod.WriteString("replace " + l.path + " => " + filepath.Join(abs, l.dir) + "\n")
			}
			write(t, filepath.Join(dir, "go.mod"), mod.String())
			var src strings.Builder
			src.WriteString("package main\n\nimport (\n")
			for _, p := range lib.imports {
				src.WriteString("\t_ " + `"` + p + `"` + "\n")
			}
			src.WriteString(")\n\nfunc main() {}\n")
			write(t, filepath.Join(dir, "main.go"), src.String())

			goCmd(t, dir, "mod", "tidy")
			graph := goCmd(t, dir, "list", "-m", "all")
			t.Logf("go list -m all of a service importing %s:\n%s", lib.dir, graph)
			for _, line := range strings.Split(strings.TrimSpace(graph), "\n") {
				for _, bad := range forbidden[lib.dir] {
					if strings.HasPrefix(line+" ", bad) {
						t.Errorf("a service importing %s gets %s in its module graph; keep %s out of %s/go.mod", lib.dir, line, strings.TrimSpace(bad), lib.dir)
					}
				}
			}
			if !strings.Contains(graph, lib.path+" ") {
				t.Errorf("%s is not in the service's graph: the check checked nothing", lib.path)
			}
		})
	}
}

// TestConsumerReadsTheContractHeaders: package consume names the headers
// it dedupes by itself (a module of its own, it does not import the outbox
// module); they must be the ones the streamer sets (package contract).
func TestConsumerReadsTheContractHeaders(t *testing.T) {
	if consume.HeaderEventID != contract.HeaderID || consume.HeaderSource != contract.HeaderSource {
		t.Errorf("consume reads headers %q and %q; the streamer sets %q and %q",
			consume.HeaderEventID, consume.HeaderSource, contract.HeaderID, contract.HeaderSource)
	}
}

// TestTestHelpersInStep: each library module carries the same small
// PostgreSQL test helper, and those that need a schema registry the same
// registry helper (a module cannot import the root module's
// internal/testenv without that module's dependencies); the copies must not
// drift apart.
func TestTestHelpersInStep(t *testing.T) {
	for file, dirs := range map[string][]string{
		"internal/pgtest/pgtest.go":   {"outbox", "idempotency", "consume", "outbox/outboxschema", "consume/consumeschema"},
		"internal/regtest/regtest.go": {"schema", "outbox/outboxschema", "consume/consumeschema"},
	} {
		var first []byte
		for i, dir := range dirs {
			b, err := os.ReadFile(filepath.Join(root, dir, file))
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				first = b
			} else if !bytes.Equal(b, first) {
				t.Errorf("%s/%s differs from %s's: copy the change to every library", dir, file, dirs[0])
			}
		}
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// goCmd runs the go command in dir, outside any workspace, and returns its
// output.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}
