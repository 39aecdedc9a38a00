package main

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// sample is one line of the Prometheus text exposition format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// metricSet is one scrape of /metrics. The harness parses the text format
// itself (a few dozen lines) rather than pulling in prometheus/common as a
// direct dependency of the module.
type metricSet []sample

// parseProm reads the Prometheus text format: comments and blank lines are
// skipped, every other line is `name{labels} value [timestamp]`.
func parseProm(r io.Reader) (metricSet, error) {
	var ms metricSet
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w", n, err)
		}
		ms = append(ms, s)
	}
	return ms, sc.Err()
}

func parseSample(line string) (sample, error) {
	s := sample{labels: map[string]string{}}
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return s, fmt.Errorf("no value in %q", line)
	}
	s.name = line[:i]
	rest := line[i:]
	if rest[0] == '{' {
		end, err := parseLabels(rest, s.labels)
		if err != nil {
			return s, fmt.Errorf("%w in %q", err, line)
		}
		rest = rest[end:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return s, fmt.Errorf("no value in %q", line)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, fmt.Errorf("value of %q: %w", line, err)
	}
	s.value = v
	return s, nil
}

// parseLabels reads `{a="x",b="y"}` at the start of s into into and returns
// the index just past the closing brace. Values may hold escaped quotes,
// backslashes and newlines.
func parseLabels(s string, into map[string]string) (int, error) {
	i := 1
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == ',') {
			i++
		}
		if i >= len(s) {
			return 0, fmt.Errorf("unterminated labels")
		}
		if s[i] == '}' {
			return i + 1, nil
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 || i+eq+1 >= len(s) || s[i+eq+1] != '"' {
			return 0, fmt.Errorf("bad label")
		}
		key := strings.TrimSpace(s[i : i+eq])
		i += eq + 2
		var b strings.Builder
		for ; i < len(s) && s[i] != '"'; i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					c = '\n'
				default:
					c = s[i]
				}
			}
			b.WriteByte(c)
		}
		if i >= len(s) {
			return 0, fmt.Errorf("unterminated label value")
		}
		into[key] = b.String()
		i++ // closing quote
	}
}

// sum adds every series of a metric (e.g. events_total over all topics).
func (ms metricSet) sum(name string) float64 {
	var t float64
	for _, s := range ms {
		if s.name == name {
			t += s.value
		}
	}
	return t
}

// value is the first series of name whose labels include the given
// key/value pairs.
func (ms metricSet) value(name string, kv ...string) (float64, bool) {
next:
	for _, s := range ms {
		if s.name != name {
			continue
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if s.labels[kv[i]] != kv[i+1] {
				continue next
			}
		}
		return s.value, true
	}
	return 0, false
}

// histogram returns the cumulative buckets of a histogram metric, sorted by
// upper bound, +Inf last.
func (ms metricSet) histogram(name string) []bucket {
	var bs []bucket
	for _, s := range ms {
		if s.name != name+"_bucket" {
			continue
		}
		le, err := strconv.ParseFloat(s.labels["le"], 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le: le, count: s.value})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	return bs
}
