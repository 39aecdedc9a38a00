// Command cdc-outbox streams a PostgreSQL transactional outbox table to
// Kafka through logical replication. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
)

// Set by `make build` (-ldflags -X); read from the build info otherwise.
var (
	version  = ""
	revision = ""
)

const usage = `cdc-outbox streams a PostgreSQL outbox table to Kafka through logical replication.
Events are confirmed to PostgreSQL only after Kafka has acknowledged them:
a crash loses nothing and repeats at most the events that were in flight.

Usage:
  cdc-outbox run [flags]          stream events (see cdc-outbox run --help)
  cdc-outbox status [flags]       show the replication slot's health (see cdc-outbox status --help)
  cdc-outbox republish [flags]    send outbox rows again from the table, as the stream would
                                  (the repair after a lost slot; see cdc-outbox republish --help)
  cdc-outbox lost-events [flags]  list the events Kafka holds of a history the database lost
                                  (after a failover past the standby; see cdc-outbox lost-events --help)
  cdc-outbox version              print version, commit and Go version

Every flag can also be set as an environment variable (--kafka-brokers is
CDC_OUTBOX_KAFKA_BROKERS) or as a key of a YAML file given with --config or
CDC_OUTBOX_CONFIG ("kafka-brokers: kafka:9092"; see cdc-outbox.example.yaml).
The command line wins over the environment, which wins over the file.
`

func main() {
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// cli runs a command and returns the process exit code: 0 success, 1 a
// failure while running, 2 a usage or configuration error.
func cli(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return runCommand(args[1:], stdout, stderr)
	case "status":
		return statusCommand(args[1:], stdout, stderr)
	case "republish":
		return republishCommand(args[1:], stdout, stderr)
	case "lost-events":
		return lostEventsCommand(args[1:], stdout, stderr)
	case "version", "--version":
		if len(args) > 1 {
			fmt.Fprintf(stderr, "cdc-outbox version: unexpected argument %q: version takes no flags or arguments\n", args[1])
			return 2
		}
		v, rev := buildVersion()
		fmt.Fprintf(stdout, "cdc-outbox %s (commit %s, %s)\n", v, rev, runtime.Version())
		return 0
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "cdc-outbox: unknown command %q\n\n%s", args[0], usage)
	return 2
}

func buildVersion() (v, rev string) {
	v, rev = version, revision
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && rev == "" {
				rev = s.Value
			}
		}
	}
	if v == "" {
		v = "dev"
	}
	if rev == "" {
		rev = "unknown"
	}
	return v, rev
}

// signalContext is cancelled by the first SIGINT or SIGTERM, which asks for
// a soft stop (drain, final status update). A second signal exits at once:
// safe, because nothing unacknowledged was confirmed.
func signalContext(log *slog.Logger) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			log.Info("stopping: draining in-flight events; signal again to exit at once", "signal", s.String())
			cancel()
		case <-done:
			return
		}
		select {
		case <-sigs:
			log.Warn("second signal: exiting now; unconfirmed events will be sent again on the next start")
			os.Exit(1)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	}
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, errors.New("use debug, info, warn or error")
	}
	return l, nil
}

func newLogger(w io.Writer, format, level string) *slog.Logger {
	l, _ := parseLevel(level) // validated with the configuration
	opts := &slog.HandlerOptions{Level: l}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
