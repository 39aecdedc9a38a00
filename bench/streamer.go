package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// streamer is one running cdc-outbox process.
type streamer struct {
	cmd     *exec.Cmd
	addr    string // of /metrics
	logPath string
	started time.Time
	done    chan struct{}
	waitErr error
	http    *http.Client
}

// startStreamer starts the binary on slot with the bench's topic template
// and its metrics endpoint on a free loopback port, and extra flags.
// Everything else is the binary's defaults, which is what is being
// measured.
func (b *bench) startStreamer(slot string, extra ...string) (*streamer, error) {
	return b.startStreamerTo(slot, b.prefix+".{aggregate_type}", extra...)
}

// startStreamerTo is startStreamer with another --topic template.
func (b *bench) startStreamerTo(slot, topic string, extra ...string) (*streamer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logf, err := os.CreateTemp(b.tmp, "streamer-"+slot+"-*.log")
	if err != nil {
		return nil, err
	}
	s := &streamer{
		addr:    fmt.Sprintf("127.0.0.1:%d", port),
		logPath: logf.Name(),
		done:    make(chan struct{}),
		http:    &http.Client{Timeout: 5 * time.Second},
	}
	args := append([]string{"run",
		"--postgres-url", b.dbURL,
		"--kafka-brokers", strings.Join(b.brokers, ","),
		"--slot", slot,
		"--topic", topic,
		"--http-addr", s.addr,
		"--pprof",
		"--log-format", "json",
	}, append(b.streamerFlags[:len(b.streamerFlags):len(b.streamerFlags)], extra...)...)
	s.cmd = exec.Command(b.bin, args...)
	s.cmd.Env = streamerEnv()
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.started = time.Now()
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	b.running[s] = struct{}{}
	go func() {
		s.waitErr = s.cmd.Wait()
		logf.Close()
		close(s.done)
	}()
	return s, nil
}

// streamerEnv is the harness's environment without CDC_OUTBOX_* variables:
// the streamer reads its flags from those (and a config file from
// CDC_OUTBOX_CONFIG), and the run must depend on the flags given here only.
func streamerEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CDC_OUTBOX_") {
			env = append(env, kv)
		}
	}
	return env
}

// freePort asks the kernel for a free loopback port. It is released before
// the streamer binds it; nothing else on the machine races for it in
// practice, and a clash fails loudly at the streamer's start.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *streamer) pid() int { return s.cmd.Process.Pid }

func (s *streamer) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// scrape reads /metrics once.
func (s *streamer) scrape(ctx context.Context) (metricSet, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return parseProm(resp.Body)
}

// waitReady waits until the streamer says it streams with Kafka reachable
// (cdc_outbox_ready 1): a steady load measured before that would include
// its start-up.
func (s *streamer) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if s.exited() {
			return s.failure("exited before it was ready")
		}
		if ms, err := s.scrape(ctx); err == nil {
			if v, ok := ms.value("cdc_outbox_ready"); ok && v == 1 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return s.failure(fmt.Sprintf("not ready after %s", timeout))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// failure is an error carrying the end of the streamer's log.
func (s *streamer) failure(what string) error {
	return fmt.Errorf("streamer %s (exit: %v); last log lines:\n%s", what, s.waitErr, s.logTail(15))
}

func (s *streamer) logTail(n int) string {
	b, _ := os.ReadFile(s.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}

// stop sends SIGTERM (the streamer drains in-flight events, confirms and
// exits 0) and waits; after timeout it kills.
func (b *bench) stopStreamer(s *streamer, timeout time.Duration) error {
	defer delete(b.running, s)
	if s.exited() {
		return nil
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		if s.waitErr != nil {
			return s.failure("did not exit cleanly after SIGTERM")
		}
		return nil
	case <-time.After(timeout):
		_ = s.cmd.Process.Kill()
		<-s.done
		return errors.New("streamer did not stop within " + timeout.String() + " of SIGTERM; killed")
	}
}

// killStreamer SIGKILLs: no drain, no last status update.
func (b *bench) killStreamer(s *streamer) {
	defer delete(b.running, s)
	_ = s.cmd.Process.Kill()
	<-s.done
}

// waitDrained polls s's metrics until Kafka acknowledged n events and
// returns that scrape and the time since s started; it fails when s exits
// or has not drained after ten minutes. logEvery > 0 logs the count that
// often.
func (s *streamer) waitDrained(ctx context.Context, n int, logEvery time.Duration) (metricSet, time.Duration, error) {
	lastLog := time.Now()
	for {
		if s.exited() {
			return nil, 0, s.failure("exited during the drain")
		}
		if ms, err := s.scrape(ctx); err == nil {
			got := ms.sum("cdc_outbox_events_total")
			if got >= float64(n) {
				return ms, time.Since(s.started), nil
			}
			if logEvery > 0 && time.Since(lastLog) >= logEvery {
				progress("  streamer: %.0f of %d events acknowledged", got, n)
				lastLog = time.Now()
			}
		}
		if time.Since(s.started) > 10*time.Minute {
			return nil, 0, s.failure("had not drained the backlog after 10 minutes")
		}
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
