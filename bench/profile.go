package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// profile is a CPU profile of the streamer taken during one phase, with
// the top of `go tool pprof -top` for the report: where a target is missed,
// it says why.
type profile struct {
	phase string // e.g. "drain, 1 event/tx"
	file  string // its name in the results folder
	path  string // where it was written during the run
	top   string
}

// cpuProfile starts a CPU profile of the streamer (--pprof) for d and
// returns a function that waits for it and summarises it. A profile that
// cannot be taken is reported in the summary, not as a failed run.
func (b *bench) cpuProfile(ctx context.Context, s *streamer, phase string, d time.Duration) (wait func() profile) {
	name := strings.NewReplacer(",", "", " ", "-", "/", "").Replace(phase) + ".cpu.pprof"
	path := filepath.Join(b.tmp, name)
	done := make(chan error, 1)
	go func() {
		url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", s.addr, int(d.Seconds()))
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			done <- err
			return
		}
		// The streamer has just been started: retry until its endpoint
		// listens.
		var resp *http.Response
		for range 100 {
			if resp, err = (&http.Client{Timeout: d + 30*time.Second}).Do(req); err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			done <- err
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(path)
		if err != nil {
			done <- err
			return
		}
		_, err = io.Copy(f, resp.Body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		done <- err
	}()
	return func() profile {
		p := profile{phase: phase, file: name, path: path}
		if err := <-done; err != nil {
			progress("  %s: no CPU profile: %v", phase, err)
			p.top = "no profile: " + err.Error()
			return p
		}
		out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", b.bin, path).CombinedOutput()
		if err != nil {
			p.top = fmt.Sprintf("go tool pprof: %v\n%s", err, out)
			return p
		}
		p.top = trimPprofHeader(string(out))
		b.profiles = append(b.profiles, p)
		return p
	}
}

// trimPprofHeader drops pprof's file and build-id lines, which differ
// between runs and say nothing about the code.
func trimPprofHeader(top string) string {
	var keep []string
	for _, line := range strings.Split(strings.TrimRight(top, "\n"), "\n") {
		if strings.HasPrefix(line, "File: ") || strings.HasPrefix(line, "Build ID: ") || strings.HasPrefix(line, "Time: ") {
			continue
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "\n")
}
