package consume

import (
	"encoding/json"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// CloudEvents records (cdc-outbox --record-format cloudevents-binary or
// cloudevents-structured) carry the event id and source as CloudEvents
// attributes, the pair that identifies an event in CloudEvents as the id
// and source headers do in the native format.
const (
	HeaderCloudEventsID          = "ce_id"          // binary mode: the event id
	HeaderCloudEventsSource      = "ce_source"      // binary mode: the source
	HeaderCloudEventsSpecVersion = "ce_specversion" // present on every binary-mode record
	headerContentType            = "content-type"
)

// cloudEventKey reads the id and source of a CloudEvents record: from the
// ce_id and ce_source headers of a binary-mode record, or from the value of
// a structured one (content-type application/cloudevents+json). ce is false
// for a record in neither mode; ok is false when the id or source is
// missing, empty or given twice with different values.
func cloudEventKey(r *kgo.Record) (ev dedupeKey, ce, ok bool) {
	if _, found := lookup(r, HeaderCloudEventsSpecVersion); found {
		id, idOK := header(r, HeaderCloudEventsID)
		source, sourceOK := header(r, HeaderCloudEventsSource)
		return dedupeKey{source: source, id: id}, true, idOK && sourceOK && id != "" && source != ""
	}
	ct, found := lookup(r, headerContentType)
	if !found {
		return dedupeKey{}, false, false
	}
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	if !strings.EqualFold(strings.TrimSpace(ct), "application/cloudevents+json") {
		return dedupeKey{}, false, false
	}
	var doc struct {
		ID     *string `json:"id"`
		Source *string `json:"source"`
	}
	if err := json.Unmarshal(r.Value, &doc); err != nil || doc.ID == nil || doc.Source == nil {
		return dedupeKey{}, true, false
	}
	return dedupeKey{source: *doc.Source, id: *doc.ID}, true, *doc.ID != "" && *doc.Source != ""
}

// lookup returns the first header named key.
func lookup(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}
