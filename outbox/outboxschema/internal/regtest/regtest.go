// Package regtest gives a library module's integration tests the real
// schema registry of the test environment.
//
// The registry is started and stopped by the control script that
// CDC_OUTBOX_TEST_REGISTRY_CTL names (`make test` names
// scripts/apicurio.sh). A missing script fails the test; only `go test
// -short` skips it. Each module that needs a registry (schema,
// outbox/outboxschema, consume/consumeschema) has this same file rather
// than the repository's internal/testenv, which would pull the streamer's
// dependencies into the module graph of every service that imports it. A
// test at the repository root keeps the copies identical.
package regtest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

const envRegistryCtl = "CDC_OUTBOX_TEST_REGISTRY_CTL"

// Start starts the registry for the test, stops it when the test ends, and
// returns the control script's runner and the registry's
// Confluent-compatible URL.
func Start(t testing.TB) (ctl func(action string) string, url string) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs a schema registry; run `make test`")
	}
	script := os.Getenv(envRegistryCtl)
	if script == "" {
		t.Fatalf("%s is not set: run `make test`, which starts Apicurio Registry, or point it at a script like scripts/apicurio.sh", envRegistryCtl)
	}
	ctl = func(action string) string {
		out, err := exec.Command(script, action).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", script, action, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	ctl("start")
	t.Cleanup(func() { ctl("stop") })
	return ctl, ctl("url")
}
