package mapping

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// benchPayload is a 200-byte JSON object.
var benchPayload = func() string {
	s := `{"order_id":"5f0c7a4e-1b2d-4c3e-9f8a-7b6c5d4e3f2a","customer":"c-1029384756","total":"129.95","currency":"EUR","lines":[{"sku":"SKU-1","qty":2},{"sku":"SKU-2","qty":1}],"pad":"`
	return s + strings.Repeat("x", 198-len(s)) + `"}`
}()

var sinkHeaders []kgo.RecordHeader

const benchHeaders = `{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tenant":"acme"}`

func BenchmarkMap(b *testing.B) {
	for _, bc := range []struct {
		name    string
		headers Column
	}{
		{"null-headers", null(oidJSONB)},
		{"headers", col(oidJSONB, benchHeaders)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if len(benchPayload) != 200 {
				b.Fatalf("payload is %d bytes", len(benchPayload))
			}
			m := mustNew(b, DefaultConfig())
			row := defaultRow()
			row["payload"] = col(oidJSONB, benchPayload)
			row["headers"] = bc.headers
			cols := colsFor(m, row)
			b.ReportAllocs()
			for b.Loop() {
				var rec kgo.Record
				if err := m.Map(cols, &rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHeaders compares the hand scanner (as Map uses it: validate, count,
// then copy out) with the json.Decoder it replaces.
func BenchmarkHeaders(b *testing.B) {
	m := mustNew(b, DefaultConfig())
	cols := colsFor(m, defaultRow())
	c := col(oidJSONB, benchHeaders)
	b.Run("scanner", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n, size, err := m.scanHeaders(cols, &c)
			if err != nil || n != 2 {
				b.Fatal(n, err)
			}
			buf := make([]byte, 0, size)
			hdrs := make([]kgo.RecordHeader, 0, n)
			it := memberIter{doc: c.Data}
			it.open()
			for {
				k, v, _, ok := it.next()
				if !ok {
					break
				}
				n := len(buf)
				buf = appendUnescaped(buf, v)
				hdrs = append(hdrs, kgo.RecordHeader{Key: m.headerKey(k), Value: buf[n:len(buf):len(buf)]})
			}
			sinkHeaders = hdrs
		}
	})
	b.Run("json.Decoder", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := refHeaders(c.Data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkParseTimestamp(b *testing.B) {
	s := "2026-12-01 00:22:33.123456+05:30"
	bs := []byte(s)
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := parseTimestamp(bs, true); !ok {
				b.Fatal()
			}
		}
	})
	b.Run("time.Parse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := time.Parse("2006-01-02 15:04:05.999999999-07:00", s); err != nil {
				b.Fatal(err)
			}
		}
	})
}
