package consumeschema_test

import (
	"context"
	"encoding/json"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/consume"
	"github.com/cdc-outbox/cdc-outbox/consume/consumeschema"
	"github.com/cdc-outbox/cdc-outbox/schema"
)

// A handler of Avro, Protobuf or JSON Schema values, given the value as
// JSON. (Compiled, not run: it needs a database, a broker and a registry.)
func ExampleHandler() {
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: "http://registry:8080/apis/ccompat/v7"})
	if err != nil {
		log.Fatal(err)
	}
	cfg := consume.Config{
		Handler: consumeschema.Handler(schema.NewDecoder(reg),
			func(ctx context.Context, tx pgx.Tx, r *kgo.Record, v consumeschema.Value) error {
				var p struct {
					ID     string
					Amount int64
				}
				if err := json.Unmarshal(v.JSON, &p); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO invoices (payment_id, amount) VALUES ($1, $2)`, p.ID, p.Amount)
				return err
			}),
		// Brokers, Group, Topics, DB: see package consume.
	}
	_ = cfg
}
