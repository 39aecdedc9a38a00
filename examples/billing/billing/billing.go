// Package billing is the consumer half of the example: it turns each
// PaymentCreated event into an invoice, exactly once per payment.
//
// cdc-outbox delivers at least once (a streamer crash re-sends what was in
// flight) and a consumer can be handed a record again (it crashed before
// committing its offset, or the group rebalanced). Handle runs under
// package consume, which records the event id in processed_events in the
// same transaction as the invoice and commits the Kafka offset only after
// that transaction: a repeat is skipped before Handle runs, and a crash at
// any point leaves either both rows or neither.
package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// EventCreated is the event type billing acts on (the "event_type" header).
const EventCreated = "PaymentCreated"

// paymentCreated is billing's view of the event payload. It is billing's
// own type, not the payments service's: the event is the contract between
// them, and billing reads only what it needs.
type paymentCreated struct {
	PaymentID string `json:"payment_id"`
	Account   string `json:"account"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
}

// Handle is the consume.Handler: for a PaymentCreated event it inserts the
// payment's invoice with tx, the transaction that also records the event as
// processed. Other event types on the topic are acknowledged and ignored.
//
// An error rolls both back; consume retries the record and then stops (or
// dead-letters it, by its policy) with the event id and offset.
func Handle(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
	if header(r, "event_type") != EventCreated {
		return nil
	}
	var p paymentCreated
	if err := json.Unmarshal(r.Value, &p); err != nil {
		return fmt.Errorf("payment %s: bad PaymentCreated payload: %w", r.Key, err)
	}
	if p.PaymentID == "" || p.Amount <= 0 {
		return errors.New("payment " + string(r.Key) + ": PaymentCreated without payment_id or amount")
	}
	// No ON CONFLICT: processed_events already dedupes by event id, so a
	// second invoice for one payment would be a bug, and the unique key on
	// payment_id makes it fail loudly instead of being absorbed.
	_, err := tx.Exec(ctx, `INSERT INTO invoices (payment_id, event_id, account, amount, currency) VALUES ($1, $2, $3, $4, $5)`,
		p.PaymentID, header(r, "id"), p.Account, p.Amount, p.Currency)
	if err != nil {
		return fmt.Errorf("invoice payment %s: %w", p.PaymentID, err)
	}
	return nil
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
