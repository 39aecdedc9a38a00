package sink

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

// kafkaSeen records what a HealthObserver was told.
type kafkaSeen struct{ calls []string }

func (k *kafkaSeen) Kafka(up, wasUp, everUp bool) {
	k.calls = append(k.calls, fmt.Sprint(up, wasUp, everUp))
}

// TestHealth: a broker that does not answer is a warning, one that refuses
// the login an error, each logged when it begins or its reason changes, not
// at every ping; the recovery is said once; the state says why, for
// readiness; the observer hears every answer.
func TestHealth(t *testing.T) {
	var logs bytes.Buffer
	var obs kafkaSeen
	h := NewHealth(nil, &obs, func(err error) string { return err.Error() + "; explained" }, slog.New(slog.NewTextHandler(&logs, nil)))
	down := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	refused := fmt.Errorf("SASL: %w", kerr.SaslAuthenticationFailed)

	steps := []struct {
		err  error
		logs string // what this answer adds to the log, "" for nothing
	}{
		{down, `level=WARN msg="Kafka does not answer; events wait in flight and nothing past them is confirmed" component=kafka-health error="dial tcp 127.0.0.1:1: connect: connection refused; explained"`},
		{down, ""},
		{nil, ""}, // the first answer is no recovery
		{nil, ""},
		{refused, `level=ERROR msg="Kafka refuses the connection; events wait in flight and nothing past them is confirmed"`},
		{refused, ""},
		{down, "level=WARN"}, // another reason
		{nil, `level=INFO msg="Kafka answers again"`},
	}
	for i, step := range steps {
		logs.Reset()
		h.record(step.err, i == 0)
		got := logs.String()
		switch {
		case step.logs == "" && got != "":
			t.Errorf("answer %d (%v): logged %s", i, step.err, got)
		case step.logs != "" && !strings.Contains(got, step.logs):
			t.Errorf("answer %d (%v): logged %q, want %q", i, step.err, got, step.logs)
		}
		if up, err := h.State(); up != (step.err == nil) || !errors.Is(err, step.err) {
			t.Errorf("answer %d (%v): state %v, %v", i, step.err, up, err)
		}
	}
	want := []string{"false false false", "false false false", "true false false", "true true true",
		"false true true", "false false true", "false false true", "true false true"}
	if fmt.Sprint(obs.calls) != fmt.Sprint(want) {
		t.Errorf("observed %v, want %v", obs.calls, want)
	}
}
