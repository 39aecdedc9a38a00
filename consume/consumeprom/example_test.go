package consumeprom_test

import (
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cdc-outbox/cdc-outbox/consume"
	"github.com/cdc-outbox/cdc-outbox/consume/consumeprom"
)

// The consumer's outcomes as Prometheus counters, served on /metrics.
// (Compiled, not run: it needs a database and a broker.)
func Example() {
	reg := prometheus.NewRegistry()
	metrics, err := consumeprom.New(reg)
	if err != nil {
		log.Fatal(err)
	}
	cfg := consume.Config{
		Hooks: metrics,
		// Brokers, Group, Topics, DB, Handler: see package consume.
	}
	_ = cfg
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
}
