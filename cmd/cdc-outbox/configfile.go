package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// The configuration file (--config, CDC_OUTBOX_CONFIG) is one YAML mapping
// whose keys are flag names without the dashes and whose values are what
// the flag takes, typed as YAML:
//
//	postgres-url: postgres://app_cdc@db:5432/payments
//	kafka-brokers: [kafka-1:9092, kafka-2:9092]   # or "kafka-1:9092,kafka-2:9092"
//	create-slot: false                            # a boolean
//	max-inflight-events: 20000                    # an integer
//	status-interval: 200ms                        # a duration, as a string
//
// One file serves every command: a key that is a flag of another command
// (run's kafka-brokers read by status, status's timeout read by run) is
// checked and then ignored. A key that is no command's flag, a value of the
// wrong type, a key given twice or a second YAML document is an error naming
// the file, the line and the key.

// fileValue is one key's value, as the flag's Set takes it, and its line.
type fileValue struct {
	value string
	line  int
}

// fileCommands builds the flags of every command that reads the
// configuration file: together they say which keys a file may have.
var fileCommands = []func() *flags{
	func() *flags { return runFlags(new(runConfig)) },
	func() *flags { return statusFlags(new(statusConfig)) },
	func() *flags { return republishFlags(new(republishConfig)) },
}

// listFlags are the comma-separated flags, which a file may also give as a
// YAML list.
var listFlags = map[string]bool{"kafka-brokers": true}

// fileKeys is every key a configuration file may have, in the commands'
// order, each with a flag that takes it (for its type).
func fileKeys() (names []string, byName map[string]*flag.Flag) {
	byName = map[string]*flag.Flag{}
	for _, build := range fileCommands {
		f := build()
		for _, name := range f.order {
			if byName[name] == nil {
				names = append(names, name)
				byName[name] = f.fs.Lookup(name)
			}
		}
	}
	return names, byName
}

// readConfigFile reads the configuration file at path and returns the
// values of f's flags in it, checked for type. Every problem in the file is
// reported at once, one per line.
func (f *flags) readConfigFile(path string) (map[string]fileValue, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %v", err)
	}
	return f.parseConfigFile(path, data)
}

func (f *flags) parseConfigFile(path string, data []byte) (map[string]fileValue, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil // empty, or only comments
		}
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	var next yaml.Node
	if err := dec.Decode(&next); err == nil {
		return nil, fmt.Errorf("%s:%d: a second YAML document; put every key in one mapping", path, next.Line)
	} else if !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil, nil
		}
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		return nil, nil // "---" and nothing else
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: want a mapping of flag names to values (e.g. \"slot: cdc_outbox\"), got %s", path, root.Line, describe(root))
	}

	names, known := fileKeys()
	out := map[string]fileValue{}
	seen := map[string]int{}
	var errs []error
	fail := func(line int, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s:%d: %s", path, line, fmt.Sprintf(format, args...)))
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			fail(k.Line, "want a flag name as key, got %s", describe(k))
			continue
		}
		name := k.Value
		if first, ok := seen[name]; ok {
			fail(k.Line, "%s is given twice (first on line %d)", name, first)
			continue
		}
		seen[name] = k.Line
		if name == outboxesKey {
			entries, err := parseOutboxes(path, v)
			if err != nil {
				errs = append(errs, err)
			} else if f.outboxes != nil {
				*f.outboxes = entries
			}
			continue
		}
		if name == configFlag {
			fail(k.Line, "%s: a configuration file cannot name another; give --config or %s", name, envName(configFlag))
			continue
		}
		fl := known[name]
		if fl == nil {
			if s := suggest(name, names); s != "" {
				fail(k.Line, "unknown key %q (did you mean %q?)", name, s)
			} else {
				fail(k.Line, "unknown key %q: the keys are the flag names without dashes (see cdc-outbox run --help)", name)
			}
			continue
		}
		value, err := fileScalar(name, fl, v)
		if err != nil {
			fail(v.Line, "%s: %v", name, err)
			continue
		}
		if f.fs.Lookup(name) != nil { // else another command's key
			out[name] = fileValue{value: value, line: v.Line}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// outboxesKey is the file's one key that is no flag: the list of outboxes
// with settings of their own (outboxEntry), which a command line cannot
// say.
const outboxesKey = "outboxes"

// parseOutboxes reads the outboxes list: each entry a mapping with table
// (a table or pattern, as --table reads one) and any of outboxKeys, each a
// string. Every problem is reported at once, with the file and line.
func parseOutboxes(path string, n *yaml.Node) ([]outboxEntry, error) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		return nil, fmt.Errorf("%s:%d: %s: want a list of outboxes, each a mapping with table and its settings (e.g. \"- table: billing.outbox\"), got %s",
			path, n.Line, outboxesKey, describe(n))
	}
	var errs []error
	fail := func(line int, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s:%d: %s", path, line, fmt.Sprintf(format, args...)))
	}
	var out []outboxEntry
	for _, item := range n.Content {
		for item.Kind == yaml.AliasNode {
			item = item.Alias
		}
		if item.Kind != yaml.MappingNode {
			fail(item.Line, "%s: want a mapping with table and its settings, got %s", outboxesKey, describe(item))
			continue
		}
		e := outboxEntry{where: fmt.Sprintf("%s:%d", path, item.Line), values: map[string]string{}}
		table := ""
		for i := 0; i+1 < len(item.Content); i += 2 {
			k, v := item.Content[i], item.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				fail(k.Line, "%s: want a key, got %s", outboxesKey, describe(k))
				continue
			}
			known := k.Value == "table" || slices.Contains(outboxKeys, k.Value)
			_, twice := e.values[k.Value]
			switch {
			case !known:
				if s := suggest(k.Value, append([]string{"table"}, outboxKeys...)); s != "" {
					fail(k.Line, "%s: unknown key %q (did you mean %q?)", outboxesKey, k.Value, s)
				} else {
					fail(k.Line, "%s: unknown key %q: an outbox takes table, %s", outboxesKey, k.Value, strings.Join(outboxKeys, ", "))
				}
				continue
			case twice || k.Value == "table" && table != "":
				fail(k.Line, "%s: %s is given twice in one outbox", outboxesKey, k.Value)
				continue
			case valueIntKeys[k.Value]:
				var n int
				if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || v.Decode(&n) != nil {
					fail(v.Line, "%s: %s: want an integer, got %s", outboxesKey, k.Value, describe(v))
					continue
				}
			case valueDurationKeys[k.Value]:
				if _, err := time.ParseDuration(v.Value); err != nil || v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
					fail(v.Line, "%s: %s: want a duration string such as \"30s\" or \"5m\", got %s", outboxesKey, k.Value, describe(v))
					continue
				}
			case v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str":
				fail(v.Line, "%s: %s: want a string, got %s", outboxesKey, k.Value, describe(v))
				continue
			}
			if k.Value == "table" {
				table = v.Value
				p, err := pgname.ParsePattern(v.Value)
				if err != nil {
					fail(v.Line, "%s: table %q: %v", outboxesKey, v.Value, err)
				}
				e.pattern = p
				continue
			}
			e.values[k.Value] = v.Value
		}
		if table == "" {
			fail(item.Line, "%s: an outbox without table: name its table or pattern (table: billing.outbox)", outboxesKey)
		}
		out = append(out, e)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// fileScalar checks that n has the YAML type fl takes and returns it as the
// string fl's Set parses.
func fileScalar(name string, fl *flag.Flag, n *yaml.Node) (string, error) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	tag := n.ShortTag()
	if n.Kind != yaml.ScalarNode && !(n.Kind == yaml.SequenceNode && listFlags[name]) {
		return "", fmt.Errorf("want %s, got %s", wantType(name, fl), describe(n))
	}
	switch fl.Value.(flag.Getter).Get().(type) {
	case bool:
		var b bool
		if tag != "!!bool" || n.Decode(&b) != nil {
			return "", fmt.Errorf("want %s, got %s", wantType(name, fl), describe(n))
		}
		return strconv.FormatBool(b), nil
	case int:
		var i int64
		if tag != "!!int" || n.Decode(&i) != nil {
			return "", fmt.Errorf("want %s, got %s", wantType(name, fl), describe(n))
		}
		if i < math.MinInt || i > math.MaxInt {
			return "", fmt.Errorf("%d is out of range", i)
		}
		return strconv.FormatInt(i, 10), nil
	case time.Duration:
		if tag == "!!int" && n.Value == "0" {
			return "0s", nil
		}
		if tag != "!!str" {
			return "", fmt.Errorf("want %s, got %s", wantType(name, fl), describe(n))
		}
		if _, err := time.ParseDuration(n.Value); err != nil {
			return "", fmt.Errorf("want %s, got %q", wantType(name, fl), n.Value)
		}
		return n.Value, nil
	default: // string
		if n.Kind == yaml.SequenceNode {
			items := make([]string, 0, len(n.Content))
			for _, item := range n.Content {
				for item.Kind == yaml.AliasNode {
					item = item.Alias
				}
				if item.Kind != yaml.ScalarNode || item.ShortTag() != "!!str" {
					return "", fmt.Errorf("want a list of strings, got %s in it", describe(item))
				}
				items = append(items, item.Value)
			}
			return strings.Join(items, ","), nil
		}
		switch tag {
		case "!!str":
			return n.Value, nil
		case "!!bool", "!!int", "!!float":
			return "", fmt.Errorf("want %s, got %s (quote it to make it a string)", wantType(name, fl), describe(n))
		}
		return "", fmt.Errorf("want %s, got %s", wantType(name, fl), describe(n))
	}
}

// wantType says in words what a flag's key takes.
func wantType(name string, fl *flag.Flag) string {
	switch fl.Value.(flag.Getter).Get().(type) {
	case bool:
		return "a boolean (true or false)"
	case int:
		return "an integer"
	case time.Duration:
		return `a duration string such as "200ms", "10s" or "1m30s"`
	}
	if listFlags[name] {
		return "a string or a list of strings"
	}
	return "a string"
}

// describe says in words what a YAML node is, for errors.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return describe(n.Alias)
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "no value (write \"\" for an empty string, or remove the key)"
		case "!!bool":
			return "the boolean " + n.Value
		case "!!int":
			return "the integer " + n.Value
		case "!!float":
			return "the number " + n.Value
		case "!!str":
			return strconv.Quote(n.Value)
		}
		return n.ShortTag() + " " + strconv.Quote(n.Value)
	}
	return "an empty document"
}

// suggest returns the known key closest to an unknown one: the same key
// spelt as a flag (--slot), with underscores or as its environment variable
// (CDC_OUTBOX_SLOT), or one at most two edits away. "" when none is close.
func suggest(key string, names []string) string {
	norm := strings.ToLower(strings.TrimLeft(key, "-"))
	norm = strings.TrimPrefix(norm, "cdc_outbox_")
	norm = strings.ReplaceAll(norm, "_", "-")
	best, bestDist := "", 3
	for _, name := range names {
		if name == norm {
			return name
		}
		if d := levenshtein(strings.ToLower(key), name); d < bestDist {
			best, bestDist = name, d
		}
	}
	return best
}

// levenshtein is the edit distance between a and b, in bytes (keys are
// ASCII).
func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
