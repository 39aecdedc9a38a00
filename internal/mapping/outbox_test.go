package mapping

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cdc-outbox/cdc-outbox/outbox"
)

// FuzzOutboxAgreesOnTopics: package outbox refuses an event exactly when
// the streamer could not publish its row for its topic or headers, under
// the same template. outbox is stricter only where PostgreSQL or the
// event's meaning is (an empty field, a NUL byte), so those inputs are
// left out.
func FuzzOutboxAgreesOnTopics(f *testing.F) {
	for _, s := range []string{"payment", "payments/eu", "payment refund", "paiement-reçu", ".", "..", "a.b_c-D9",
		strings.Repeat("p", 236), strings.Repeat("p", 237), strings.Repeat("p", 240), "\xff", "\t"} {
		f.Add(s, "PaymentCreated")
		f.Add("payment", s)
	}
	templates := []string{DefaultConfig().Topic, "{aggregate_type}", "{aggregate_type}.{event_type}", "events.{aggregate_id}"}
	writers := make([]*outbox.Writer, len(templates))
	for i, tmpl := range templates {
		w, err := outbox.New(outbox.Config{Topic: tmpl})
		if err != nil {
			f.Fatal(err)
		}
		writers[i] = w
	}
	f.Fuzz(func(t *testing.T, aggregateType, eventType string) {
		for _, s := range []string{aggregateType, eventType} {
			if s == "" || strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
				t.Skip()
			}
		}
		for i, tmpl := range templates {
			cfg := DefaultConfig()
			cfg.Topic = tmpl
			_, mapErr := mapRow(t, cfg, map[string]Column{
				"aggregate_type": col(oidText, aggregateType),
				"event_type":     col(oidText, eventType),
			})
			outErr := writers[i].Validate(outbox.Event{AggregateType: aggregateType, AggregateID: "o-1", EventType: eventType, Payload: []byte(`{"a": 1}`)})
			if (mapErr == nil) != (outErr == nil) {
				t.Errorf("template %q, aggregate type %q, event type %q: the streamer says %v, package outbox says %v",
					tmpl, aggregateType, eventType, mapErr, outErr)
			}
		}
	})
}
