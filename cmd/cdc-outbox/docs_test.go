package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
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
		{command: "lost-events", flags: lostEventsFlags(&lostEventsConfig{}), shared: run},
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

// shellCommand is one command of a shell block in the docs: its words as
// sh would split them (quotes removed, nothing expanded), where it is, and
// its text.
type shellCommand struct {
	file  string
	line  int
	words []string
}

var sslRootCert = regexp.MustCompile(`[?&]sslrootcert=[^&]*(&|$)`)

// assignment is a variable set for one command: PGPASSWORD=... cdc-outbox run.
var assignment = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)

// openFence begins a fenced block and names its language.
var openFence = regexp.MustCompile("^\\s*```\\s*([a-z]*)")

// shellCommands are the commands of a Markdown file's sh blocks: a
// backslash at the end of a line or an open quote continues a command;
// a newline, ;, && and || end it; # begins a comment; an & that puts it
// in the background is dropped.
func shellCommands(file, text string) []shellCommand {
	var cmds []shellCommand
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		m := openFence.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		start := i + 1
		for i++; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "```"); i++ {
		}
		if m[1] != "sh" && m[1] != "bash" && m[1] != "shell" { // output, or another language
			continue
		}
		cmds = append(cmds, splitShell(file, start+1, strings.Join(lines[start:i], "\n"))...)
	}
	return cmds
}

func splitShell(file string, line int, block string) []shellCommand {
	var (
		cmds       []shellCommand
		cur        = shellCommand{file: file, line: line}
		word       strings.Builder
		inWord     bool
		quote      rune
		rs         = []rune(block)
		endWord    = func() { cur.words = append(cur.words, word.String()); word.Reset(); inWord = false }
		endCommand = func() {
			if inWord {
				endWord()
			}
			if len(cur.words) > 0 {
				cmds = append(cmds, cur)
			}
			cur = shellCommand{file: file, line: line}
		}
	)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote == '\'':
			if r == '\'' {
				quote = 0
			} else {
				word.WriteRune(r)
			}
		case r == '\\' && i+1 < len(rs):
			i++
			if rs[i] == '\n' {
				line++
				continue
			}
			if quote == '"' && !strings.ContainsRune(`$"\`+"`", rs[i]) {
				word.WriteRune('\\')
			}
			word.WriteRune(rs[i])
			inWord = true
		case quote == '"':
			if r == '"' {
				quote = 0
			} else {
				if r == '\n' {
					line++
				}
				word.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == '#' && !inWord:
			for i+1 < len(rs) && rs[i+1] != '\n' {
				i++
			}
		case r == '\n' || r == ';':
			if r == '\n' {
				line++ // before the next command begins
			}
			endCommand()
		case (r == '&' || r == '|') && i+1 < len(rs) && rs[i+1] == r:
			i++
			endCommand()
		case r == '&':
			endCommand()
		case r == ' ' || r == '\t':
			if inWord {
				endWord()
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	endCommand()
	return cmds
}

func TestSplitShell(t *testing.T) {
	got := splitShell("f", 1, "PGPASSWORD=\"$P\" bin/cdc-outbox run --a 'x y' \\\n  --b \"q\\\"r\"   # note\nmake build && cdc-outbox version &\n")
	want := [][]string{{"PGPASSWORD=$P", "bin/cdc-outbox", "run", "--a", "x y", "--b", `q"r`}, {"make", "build"}, {"cdc-outbox", "version"}}
	if len(got) != len(want) {
		t.Fatalf("got %d commands %v, want %v", len(got), got, want)
	}
	for i := range want {
		if !slices.Equal(got[i].words, want[i]) {
			t.Errorf("command %d: %q, want %q", i, got[i].words, want[i])
		}
	}
	if got[1].line != 3 {
		t.Errorf("the second command is on line %d, want 3", got[1].line)
	}
}

// docsValue stands in for a shell variable the docs leave to the reader
// ("$DATABASE_URL"), by the flag it is the value of.
var docsValue = map[string]string{
	"postgres-url":  "postgres://app@db.internal:5432/app",
	"kafka-brokers": "kafka:9092",

	"schema-registry-url": "http://registry.internal:8081",
}

// TestDriftDocsCommands: every cdc-outbox command that a shell block of
// the docs shows takes the flags it is given, and its values pass the
// checks run makes before it connects anywhere: a renamed flag or a
// changed value breaks this test, not a reader's copy and paste. (What a
// test can run against the servers, e2e runs: the README's five minutes,
// TestReadmeFiveMinutes.)
func TestDriftDocsCommands(t *testing.T) {
	seen := map[string]int{}
	for _, file := range markdownFiles(t) {
		if strings.HasPrefix(file, "CHANGELOG") || strings.HasPrefix(file, "bench/") {
			continue // history, and generated reports
		}
		for _, c := range shellCommands(file, readDoc(t, file)) {
			w := c.words
			if len(w) > 0 && w[0] == "$" { // a prompt
				w = w[1:]
			}
			for len(w) > 0 && assignment.MatchString(w[0]) {
				w = w[1:]
			}
			if len(w) < 2 || path.Base(w[0]) != "cdc-outbox" {
				continue
			}
			where := fmt.Sprintf("%s:%d: cdc-outbox %s", c.file, c.line, strings.Join(w[1:], " "))
			seen[w[1]]++
			var args []string
			for i := 2; i < len(w); i++ {
				a := w[i]
				if a == "..." {
					continue
				}
				args = append(args, a)
			}
			for i, a := range args {
				if !strings.Contains(a, "$") || i == 0 {
					continue
				}
				name := strings.TrimPrefix(args[i-1], "--")
				v, ok := docsValue[name]
				if !ok {
					t.Errorf("%s: no stand-in for %q, the value of --%s: add one to docsValue", where, a, name)
				}
				args[i] = v
			}
			for i, a := range args {
				if a == "--postgres-url" && i+1 < len(args) {
					// The CA file a URL names is the reader's; pgx reads it.
					args[i+1] = sslRootCert.ReplaceAllString(args[i+1], "$1")
				}
				if a == "--config" && i+1 < len(args) {
					args[i+1] = "../../cdc-outbox.example.yaml" // the docs' file is the reader's
				}
			}
			var err error
			switch w[1] {
			case "run":
				var c runConfig
				if err = runFlags(&c).parse(args, io.Discard); err == nil {
					err = c.validate()
				}
			case "status":
				var c statusConfig
				if err = statusFlags(&c).parse(args, io.Discard); err == nil {
					err = c.validate()
				}
			case "republish":
				var c republishConfig
				if err = republishFlags(&c).parse(args, io.Discard); err == nil {
					err = c.validate()
				}
			case "lost-events":
				var c lostEventsConfig
				if err = lostEventsFlags(&c).parse(args, io.Discard); err == nil {
					err = c.validate()
				}
			case "version":
				if len(args) > 0 {
					err = fmt.Errorf("version takes no arguments")
				}
			default:
				err = fmt.Errorf("no such command")
			}
			if err != nil {
				t.Errorf("%s:\n%v", where, err)
			}
		}
	}
	for _, cmd := range []string{"run", "status", "version"} {
		if seen[cmd] == 0 {
			t.Errorf("no cdc-outbox %s command found in the docs' shell blocks: the finder is broken (found %v)", cmd, seen)
		}
	}
}
