// Command fakeprovider serves the fake card provider of the payments example
// (package provider) on its own, with charges kept in memory:
//
//	go run ./examples/payments/fakeprovider --listen 127.0.0.1:8081
//	curl -s http://127.0.0.1:8081/charges   # how many charges, replays and declines
//
// --lose 0.5 loses half of its answers after charging (503), as a network
// or a provider outage would: the payments service then rolls back and its
// client retries, and the retry's charge request, under the same derived
// key, is answered with the charge already made.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"time"

	"github.com/cdc-outbox/cdc-outbox/examples/payments/provider"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8081", "address to serve on")
	limit := flag.Int64("limit", provider.DefaultLimit, "amounts above this (in minor units) are declined with 402")
	lose := flag.Float64("lose", 0, "fraction (0 to 1) of answers to POST /charges to lose after charging, answering 503 instead")
	flag.Parse()

	p := provider.New(*limit)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// Log each request and how it was answered: a replay is the provider
	// saying "I already did this", which is the point of the example.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && rand.Float64() < *lose {
			// Charge, then answer as if the provider had failed.
			p.ServeHTTP(&discard{header: http.Header{}}, r)
			log.Info("request answered 503 after it was handled (--lose)", "method", r.Method, "path", r.URL.Path,
				"key", r.Header.Get(provider.HeaderKey), "charges", p.Charges())
			http.Error(w, `{"error": "temporarily unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		rw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		p.ServeHTTP(rw, r)
		log.Info("request", "method", r.Method, "path", r.URL.Path, "key", r.Header.Get(provider.HeaderKey),
			"status", rw.status, "replayed", w.Header().Get(provider.HeaderReplayed) == "true", "charges", p.Charges())
	})
	log.Info("fake card provider", "addr", *listen, "limit", *limit, "lose", *lose)
	srv := &http.Server{Addr: *listen, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, "fakeprovider:", err)
		os.Exit(1)
	}
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// discard is a ResponseWriter that throws the answer away.
type discard struct{ header http.Header }

func (d *discard) Header() http.Header         { return d.header }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}
