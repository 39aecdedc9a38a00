package sink

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// pingEvery is how often Health asks for metadata, and how long it waits
// for an answer.
const pingEvery = 5 * time.Second

// HealthObserver is told every answer; metrics implement it: up is whether
// the broker answered now, wasUp before, everUp ever before.
type HealthObserver interface {
	Kafka(up, wasUp, everUp bool)
}

// Pinger asks a broker for metadata; *Sink is one.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Health asks a broker for metadata every few seconds: whether Kafka is
// reachable (readiness, cdc_outbox_connected{target="kafka"}) comes from the
// answer. A failure is logged when Kafka stops answering, at the first
// attempt, and whenever the reason changes: a wrong password or certificate
// (a Fault) never heals by itself, so the operator must hear of it at start,
// as an error, not only from readiness.
type Health struct {
	ping    Pinger
	obs     HealthObserver
	explain func(error) string
	log     *slog.Logger
	every   time.Duration

	mu           sync.Mutex
	isUp, wasUp  bool
	everAnswered bool
	err          error // the last failure; nil while up
	said         string
}

// NewHealth returns a health check of p; Run starts it. explain renders an
// error for the log, with what to do (the command's advice); nil logs the
// error as it is.
func NewHealth(p Pinger, obs HealthObserver, explain func(error) string, log *slog.Logger) *Health {
	if explain == nil {
		explain = func(err error) string { return err.Error() }
	}
	return &Health{ping: p, obs: obs, explain: explain, log: log.With("component", "kafka-health"), every: pingEvery}
}

// State reports whether the broker answered the last metadata request and,
// when not, the error it failed with (nil before the first answer).
func (h *Health) State() (up bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.isUp, h.err
}

// Run pings until ctx ends.
func (h *Health) Run(ctx context.Context) {
	first := true
	for {
		pctx, cancel := context.WithTimeout(ctx, h.every)
		err := h.ping.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		h.record(err, first)
		first = false
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.every):
		}
	}
}

// record takes one answer: err is nil when the broker answered.
func (h *Health) record(err error, first bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wasUp, h.isUp = h.isUp, err == nil
	h.obs.Kafka(h.isUp, h.wasUp, h.everAnswered)
	said := ""
	if err != nil {
		said = h.explain(err)
	}
	news := err != nil && (first || h.wasUp || said != h.said)
	switch {
	case news && FaultOf(err) != NoFault:
		h.log.Error("Kafka refuses the connection; events wait in flight and nothing past them is confirmed", "error", said)
	case news:
		h.log.Warn("Kafka does not answer; events wait in flight and nothing past them is confirmed", "error", said)
	case err == nil && !h.wasUp && h.everAnswered:
		h.log.Info("Kafka answers again")
	}
	h.err, h.said = err, said
	h.everAnswered = h.everAnswered || h.isUp
}
