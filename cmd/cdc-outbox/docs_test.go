package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// The documentation's tests that need the flag definitions: the flag tables
// of docs/configuration.md, and every cdc-outbox command the docs show.
// (The link and heading checks are in markdown_test.go.)

var updateDocs = flag.Bool("update", false, "rewrite the generated flag tables of docs/configuration.md from the flag definitions")

const configurationPage = "../../docs/configuration.md"

// flagSection is one generated block of the configuration page: the flags
// of a command, less those it shares with shared (the same name, default
// and help), which are listed by name under the table.
type flagSection struct {
	command string
	flags   *flags
	shared  *flags
}

func flagSections() []flagSection {
	run := runFlags(&runConfig{})
	return []flagSection{
		{command: "run", flags: run},
		{command: "status", flags: statusFlags(&statusConfig{}), shared: run},
		{command: "republish", flags: republishFlags(&republishConfig{}), shared: run},
	}
}

// begin and end mark a generated block in the page.
func (s flagSection) begin() string {
	return "<!-- the flags of cdc-outbox " + s.command + ": generated from their definitions in cmd/cdc-outbox; " +
		"change the help there and run go test ./cmd/cdc-outbox -run TestDriftConfigurationPage -update -->"
}
func (s flagSection) end() string { return "<!-- end of the flags of cdc-outbox " + s.command + " -->" }

// generate is the block's text: a plain Markdown table, one row per flag
// in registration order, as --help prints them.
func (s flagSection) generate() string {
	var b strings.Builder
	b.WriteString("| flag | environment variable | file key | default | meaning |\n|---|---|---|---|---|\n")
	var same []string
	for _, name := range s.flags.order {
		fl := s.flags.fs.Lookup(name)
		_, help := flag.UnquoteUsage(fl)
		if s.shared != nil {
			if o := s.shared.fs.Lookup(name); o != nil && o.DefValue == fl.DefValue && o.Usage == fl.Usage {
				same = append(same, "`--"+name+"`")
				continue
			}
		}
		def := ""
		if fl.DefValue != "" {
			def = "`" + fl.DefValue + "`"
		}
		fmt.Fprintf(&b, "| `--%s` | `%s` | `%s` | %s | %s |\n", name, envName(name), name, def, markdownText(help))
	}
	if len(same) > 0 {
		fmt.Fprintf(&b, "\nAnd, with the same meaning, default, environment variable and file key as for `run`: %s.\n", strings.Join(same, ", "))
	}
	return b.String()
}

// markdownText escapes what Markdown would otherwise take for a table
// cell's end, emphasis or an HTML tag.
func markdownText(s string) string {
	return strings.NewReplacer(`|`, `\|`, `<`, `\<`, `>`, `\>`, `*`, `\*`, "`", "\\`").Replace(s)
}

// TestDriftConfigurationPage keeps the flag tables of docs/configuration.md
// equal to the flag definitions: every flag of run, status and republish,
// with its environment variable, its configuration file key, its default
// and its help. The tables are generated: a new or changed flag is one
// `go test ./cmd/cdc-outbox -run TestDriftConfigurationPage -update` away.
func TestDriftConfigurationPage(t *testing.T) {
	page, err := os.ReadFile(configurationPage)
	if err != nil {
		t.Fatal(err)
	}
	text := string(page)
	for _, s := range flagSections() {
		i, j := strings.Index(text, s.begin()), strings.Index(text, s.end())
		if i < 0 || j < i {
			t.Errorf("%s has no block of the flags of %s: want a line\n%s\nthen the table, then\n%s", configurationPage, s.command, s.begin(), s.end())
			continue
		}
		got, want := strings.TrimSpace(text[i+len(s.begin()):j]), strings.TrimSpace(s.generate())
		if got == want {
			continue
		}
		if *updateDocs {
			text = text[:i+len(s.begin())] + "\n" + want + "\n" + text[j:]
			continue
		}
		gotLines, wantLines := strings.Split(got, "\n"), strings.Split(want, "\n")
		for _, l := range wantLines {
			if !slices.Contains(gotLines, l) {
				t.Errorf("%s, flags of %s: missing or different:\n%s", configurationPage, s.command, l)
			}
		}
		for _, l := range gotLines {
			if !slices.Contains(wantLines, l) {
				t.Errorf("%s, flags of %s: not what the definitions say:\n%s", configurationPage, s.command, l)
			}
		}
		if !t.Failed() {
			t.Errorf("%s, flags of %s: the rows are out of order", configurationPage, s.command)
		}
		t.Logf("to regenerate the tables: go test ./cmd/cdc-outbox -run TestDriftConfigurationPage -update")
	}
	if *updateDocs && text != string(page) {
		if err := os.WriteFile(configurationPage, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the flag tables of %s", configurationPage)
	}
}
