package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
)

// findRecvlogical locates pg_recvlogical: on PATH, else the newest
// /usr/lib/postgresql/*/bin (Debian keeps server-side tools there).
func findRecvlogical() (string, error) {
	if p, err := exec.LookPath("pg_recvlogical"); err == nil {
		return p, nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_recvlogical")
	if len(found) == 0 {
		return "", errors.New("pg_recvlogical not found on PATH nor in /usr/lib/postgresql/*/bin (Debian: apt-get install postgresql-client)")
	}
	sort.Slice(found, func(i, j int) bool { return versionDir(found[i]) < versionDir(found[j]) })
	return found[len(found)-1], nil
}

// versionDir orders /usr/lib/postgresql/<major>/bin paths by major version.
func versionDir(p string) int {
	var v int
	fmt.Sscanf(filepath.Base(filepath.Dir(filepath.Dir(p))), "%d", &v)
	return v
}

// runRecvlogical is the first reference: PostgreSQL's own client reading the
// slot with the same plugin options, writing to /dev/null, stopping at end
// (-E), with no fsync and no loop. It returns its wall time and its own CPU
// time.
func runRecvlogical(ctx context.Context, bin, url, slot, publication string, end pglogrepl.LSN) (wall, cpu time.Duration, err error) {
	var out strings.Builder
	cmd := exec.CommandContext(ctx, bin, "-d", url, "--slot", slot, "--start",
		"-o", "proto_version=1", "-o", "publication_names="+publication,
		"-E", end.String(), "-f", "/dev/null", "--no-loop", "-F", "0")
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	wall = time.Since(start)
	if cmd.ProcessState != nil {
		cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	if err != nil {
		return wall, cpu, fmt.Errorf("pg_recvlogical: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return wall, cpu, nil
}

// selfCPU is this process's CPU time so far: the Go reader runs inside the
// harness, and nothing else in it is busy while the reader runs.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// walsenderSampler follows the CPU time of the walsender serving a slot:
// the server side of every reader, which decodes the WAL. It polls the
// slot's active_pid and that process's /proc/<pid>/stat every 100 ms and
// keeps the last reading, since the walsender exits with its client. It
// reads nothing when the server is not on this machine (the pid is not a
// local postgres process).
type walsenderSampler struct {
	stopOnce sync.Once
	stopCh   chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	cpu      time.Duration
	seen     bool
}

func sampleWalsender(ctx context.Context, pool *pgxpool.Pool, slot string) *walsenderSampler {
	s := &walsenderSampler{stopCh: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		pid := 0
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if pid == 0 {
				var p *int32
				err := pool.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&p)
				if err == nil && p != nil && procComm(int(*p)) == "postgres" {
					pid = int(*p)
				}
			}
			if pid != 0 {
				if cpu, err := readCPU(pid); err == nil {
					s.mu.Lock()
					s.cpu, s.seen = cpu, true
					s.mu.Unlock()
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-s.stopCh:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends sampling and returns the walsender's CPU time at the last
// reading (ok=false if it was never read).
func (s *walsenderSampler) stop() (time.Duration, bool) {
	s.stopOnce.Do(func() { close(s.stopCh) })
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cpu, s.seen
}
