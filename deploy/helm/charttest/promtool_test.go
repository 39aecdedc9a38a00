package charttest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// promtoolPath returns the promtool that deploy/deploy_test.go builds and
// caches in .local/promtool/<version>-<os>-<arch> of the checkout (the
// version is read from that file, so both test the rules with one
// Prometheus), building it the same way when it is missing; PROMTOOL names
// another binary.
func promtoolPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	src, err := os.ReadFile(filepath.Join(repoRoot, "deploy/deploy_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`promtoolVersion = "(v[^"]+)"`).FindSubmatch(src)
	if m == nil {
		t.Fatal("deploy/deploy_test.go: no promtoolVersion")
	}
	version := string(m[1])
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, ".local", "promtool", version+"-"+runtime.GOOS+"-"+runtime.GOARCH)
	bin := filepath.Join(dir, "promtool")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if testing.Short() {
		t.Skipf("-short: promtool %s is not built yet (%s); go test ./deploy/ in the checkout builds it", version, bin)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	ctx := context.Background()
	if deadline, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-10*time.Second))
		defer cancel()
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "install", "github.com/prometheus/prometheus/cmd/promtool@"+version)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install promtool@%s: %v\n%s", version, err, out)
	}
	if err := os.Rename(filepath.Join(tmp, "promtool"), bin); err != nil {
		t.Fatal(err)
	}
	t.Logf("built promtool %s in %s (cached in %s)", version, time.Since(start).Round(time.Second), bin)
	return bin
}

func runPromtool(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
