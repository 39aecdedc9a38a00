package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"time"
)

// outboxSample is one per-outbox sample line of /metrics:
// cdc_outbox_outbox_events_total{outbox="svc_a.outbox"} 42.
var outboxSample = regexp.MustCompile(`^(cdc_outbox_outbox_events_total|cdc_outbox_outbox_last_event_timestamp_seconds)\{outbox="((?:[^"\\]|\\.)*)"\} (\S+)$`)

// schemaSample is one sample of the schemas in use:
// cdc_outbox_schema_info{outbox="...",registry="...",schema_id="3",subject="...",version="2"} 1.
var (
	schemaSample = regexp.MustCompile(`^cdc_outbox_schema_info\{(.*)\} 1$`)
	sampleLabel  = regexp.MustCompile(`([a-z_]+)="((?:[^"\\]|\\.)*)"`)
)

// scrapeOutboxes reads a running streamer's /metrics at url and returns
// each outbox table's events streamed and the commit time of its last
// event, by table name, and the schemas its outboxes write by.
func scrapeOutboxes(ctx context.Context, url string) (streamed map[string]int64, last map[string]time.Time, schemas []statusSchema, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, nil, fmt.Errorf("%s answered %s", url, resp.Status)
	}
	streamed, last = map[string]int64{}, map[string]time.Time{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m := schemaSample.FindStringSubmatch(sc.Text()); m != nil {
			labels := map[string]string{}
			for _, l := range sampleLabel.FindAllStringSubmatch(m[1], -1) {
				if v, err := strconv.Unquote(`"` + l[2] + `"`); err == nil {
					labels[l[1]] = v
				}
			}
			id, _ := strconv.Atoi(labels["schema_id"])
			version, _ := strconv.Atoi(labels["version"])
			schemas = append(schemas, statusSchema{Outbox: labels["outbox"], Registry: labels["registry"], Subject: labels["subject"], ID: id, Version: version})
			continue
		}
		m := outboxSample.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		table, err := strconv.Unquote(`"` + m[2] + `"`)
		if err != nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		if m[1] == "cdc_outbox_outbox_events_total" {
			streamed[table] = int64(v)
		} else if v > 0 {
			sec, frac := math.Modf(v)
			last[table] = time.Unix(int64(sec), int64(frac*1e9))
		}
	}
	slices.SortFunc(schemas, func(a, b statusSchema) int {
		return cmp.Or(cmp.Compare(a.Outbox, b.Outbox), cmp.Compare(a.Subject, b.Subject))
	})
	return streamed, last, schemas, sc.Err()
}

// estimate is a rows estimate in words: -1 is unknown.
func estimate(n int64) string {
	if n < 0 {
		return "unknown (never analyzed)"
	}
	return strconv.FormatInt(n, 10)
}
