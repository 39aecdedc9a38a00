package e2e

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestDemoStopsCleanlyOnCtrlC runs `make demo`'s script as a terminal
// would, in a process group of its own, waits until it shows the events
// and says "Press Ctrl-C", then sends SIGINT to the whole group, as Ctrl-C
// does. One Ctrl-C must stop it cleanly: the streamer drains and stops
// (it is not sent a second signal, which would make it exit at once), the
// script exits 0, and no process of the demo is left. The demo runs with
// servers of its own, in a state folder of the test's (CDC_OUTBOX_LOCAL).
//
// Its stdout is a pipe that is gone by the Ctrl-C, as in `make demo | tee
// demo.log`, where the Ctrl-C stops tee too: the cleanup must finish all
// the same (it once died on its first echo, of SIGPIPE, and left both
// servers running), and say what it did on stderr.
func TestDemoStopsCleanlyOnCtrlC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL and a Kafka of its own")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	env := append(os.Environ(), "CDC_OUTBOX_LOCAL="+state, "CDC_OUTBOX_DEMO_HTTP_PORT="+strconv.Itoa(testenv.FreePort(t)))
	demoState := demoStateDir(state)
	t.Cleanup(func() {
		for _, script := range []string{"scripts/postgres.sh", "scripts/kafka.sh"} {
			c := exec.Command(script, "destroy")
			c.Dir, c.Env = root, append(env[:len(env):len(env)], "CDC_OUTBOX_LOCAL="+demoState)
			if out, err := c.CombinedOutput(); err != nil {
				t.Logf("%s destroy: %v\n%s", script, err, out)
			}
		}
	})

	demo := exec.Command("scripts/demo.sh")
	demo.Dir, demo.Env = root, env
	demo.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out lockedBuffer
	stdout, pipe, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	demo.Stdout, demo.Stderr = pipe, &out
	if err := demo.Start(); err != nil {
		t.Fatal(err)
	}
	pipe.Close() // the demo holds the write end
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&out, stdout); close(copied) }()
	exited := make(chan error, 1)
	go func() { exited <- demo.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(-demo.Process.Pid, syscall.SIGKILL) }) // only if the test failed midway

	deadline := time.After(10 * time.Minute) // a first run downloads the Kafka jars
	for !strings.Contains(out.String(), "Press Ctrl-C to stop everything.") {
		select {
		case err := <-exited:
			t.Fatalf("the demo exited before it was ready (%v):\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("the demo was not ready within 10 minutes:\n%s", out.String())
		case <-time.After(100 * time.Millisecond):
		}
	}

	// Ctrl-C: tee is gone, and the terminal signals the foreground
	// process group.
	stdout.Close()
	<-copied
	if err := syscall.Kill(-demo.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the demo exited with %v after one Ctrl-C, want 0:\n%s", err, out.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("the demo did not stop within 3 minutes of Ctrl-C:\n%s", out.String())
	}
	if i := strings.Index(out.String(), "Stopping"); i >= 0 {
		t.Logf("the demo after Ctrl-C:\n%s", out.String()[i:])
	}
	if !strings.Contains(out.String(), "cdc-outbox stopped") {
		t.Errorf("the demo does not say the streamer stopped:\n%s", out.String())
	}
	log, err := os.ReadFile(filepath.Join(demoState, "demo-streamer.log"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(log, []byte("second signal")) || !bytes.Contains(log, []byte("msg=stopped")) {
		t.Errorf("the streamer did not stop cleanly on one signal:\n%s", log)
	}

	// The demo had servers of its own, and said where their data is.
	if _, err := os.Stat(filepath.Join(state, "postgres")); err == nil {
		t.Errorf("the demo used the tests' PostgreSQL state folder %s", filepath.Join(state, "postgres"))
	}
	datadir := exec.Command("scripts/postgres.sh", "datadir")
	datadir.Dir, datadir.Env = root, append(env[:len(env):len(env)], "CDC_OUTBOX_LOCAL="+demoState)
	if b, err := datadir.Output(); err != nil {
		t.Error(err)
	} else if where := strings.TrimSpace(string(b)); !strings.Contains(out.String(), "servers stopped; their data stays for the next demo: "+demoState) ||
		(!strings.HasPrefix(where, demoState) && !strings.Contains(out.String(), "PostgreSQL's data folder "+where)) {
		t.Errorf("the demo does not say where its data is (%s, PostgreSQL's in %s):\n%s", demoState, where, out.String())
	}

	// Nothing of the demo is left: no process runs from its state folder
	// (the streamer's binary, the broker's configuration), and its
	// PostgreSQL (whose data may live elsewhere when run as root) is down.
	if left := processesMentioning(t, state); len(left) > 0 {
		t.Errorf("processes left behind: %s", strings.Join(left, "; "))
	}
	status := exec.Command("scripts/postgres.sh", "status")
	status.Dir, status.Env = root, append(env[:len(env):len(env)], "CDC_OUTBOX_LOCAL="+demoState)
	if b, err := status.CombinedOutput(); err == nil {
		t.Errorf("the demo's PostgreSQL still runs: %s", b)
	}
}

// demoStateDir is where the demo keeps its servers' state under the state
// folder local: servers of its own, not the tests'.
func demoStateDir(local string) string { return filepath.Join(local, "demo") }

// processesMentioning lists the running processes whose command line
// contains s.
func processesMentioning(t *testing.T, s string) []string {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat")); err == nil && strings.Contains(string(stat), ") Z ") {
			continue // a zombie runs nothing
		}
		if line := strings.ReplaceAll(string(cmdline), "\x00", " "); strings.Contains(line, s) {
			found = append(found, d.Name()+": "+line)
		}
	}
	return found
}

// lockedBuffer is a bytes.Buffer that a process writes while the test
// reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
