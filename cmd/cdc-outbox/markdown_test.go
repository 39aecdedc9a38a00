package main

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// The documentation's own checks: every relative link and #anchor of every
// Markdown file in the repository resolves, the README stays a front door
// that maps every page under docs/, and each section of the README before
// it became one still has a home.

// markdownFiles lists the repository's Markdown files, relative to its
// root, skipping hidden folders (.git, the local servers' .local) and
// build output.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, p)
		if d.IsDir() && rel != "." && (strings.HasPrefix(d.Name(), ".") || rel == "bin" || rel == filepath.Join("bench", "work")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "docs/guarantees.md", "examples/README.md"} {
		if !slices.Contains(files, want) {
			t.Fatalf("the walk found no %s: it checks nothing (found %v)", want, files)
		}
	}
	return files
}

func readDoc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	// A code span, within a paragraph; its text is no link.
	codeSpan = regexp.MustCompile("``[^`]+``|`[^`]+`")
	// An inline link or image: [text](target "title"). The text may hold
	// code and span lines.
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	refLink    = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	htmlLink   = regexp.MustCompile(`<(?:a|img)\s[^>]*\b(?:href|src)="([^"]*)"`)
	htmlAnchor = regexp.MustCompile(`<a\s[^>]*\b(?:id|name)="([^"]*)"`)
	scheme     = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	inlineText = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag    = regexp.MustCompile(`<[^>]+>`)
)

// prose is the text of a Markdown file with its fenced code blocks blanked
// (line numbers kept), so that neither links nor headings are looked for
// in code.
func prose(text string) []string {
	lines := strings.Split(text, "\n")
	in := false
	for i, l := range lines {
		if fence.MatchString(l) {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return lines
}

// headings are a Markdown file's ATX headings, as text: what GitHub shows.
func headings(text string) []string {
	var hs []string
	for _, l := range prose(text) {
		if m := atxHeading.FindStringSubmatch(l); m != nil {
			hs = append(hs, headingText(m[2]))
		}
	}
	return hs
}

// headingText is a heading as rendered: links and images by their text,
// code spans and HTML tags without their markup.
func headingText(s string) string {
	s = inlineText.ReplaceAllString(s, "$1")
	s = htmlTag.ReplaceAllString(s, "")
	return strings.ReplaceAll(s, "`", "")
}

// slug is GitHub's anchor for a heading (github-slugger): lower case;
// everything but letters, marks, numbers, connector punctuation (_),
// spaces and hyphens dropped; each space a hyphen.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsNumber(r) || unicode.Is(unicode.Pc, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the fragments a Markdown file answers to: a slug per
// heading (a repeated one numbered -1, -2, ... as GitHub does) and the
// ids of HTML anchors.
func anchors(text string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, h := range headings(text) {
		s := slug(h)
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	for _, m := range htmlAnchor.FindAllStringSubmatch(text, -1) {
		out[m[1]] = true
	}
	return out
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Re-publishing events: `cdc-outbox republish`":                   "re-publishing-events-cdc-outbox-republish",
		"Exactly once (`--delivery exactly-once`)":                       "exactly-once---delivery-exactly-once",
		"How a slot is lost, and what `max_slot_wal_keep_size` does":     "how-a-slot-is-lost-and-what-max_slot_wal_keep_size-does",
		"The outbox table's shape":                                       "the-outbox-tables-shape",
		"Against the walsender (`make bench`, [latest.md](x/latest.md))": "against-the-walsender-make-bench-latestmd",
		"PostgreSQL 14 to 16":                                            "postgresql-14-to-16",
	} {
		if got := slug(headingText(heading)); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
	if a := anchors("# A\n## Setup\n```\n# not a heading\n```\n## Setup\n"); !a["setup"] || !a["setup-1"] || a["not-a-heading"] {
		t.Errorf("anchors: %v", a)
	}
}

// links are the relative link targets of a Markdown file, with the line
// each is on.
func links(text string) (targets []string, lines []int) {
	ls := prose(text)
	body := strings.Join(ls, "\n")
	// Blank code spans, keeping their length and line breaks, so offsets
	// still give line numbers.
	body = codeSpan.ReplaceAllStringFunc(body, func(s string) string {
		return strings.Map(func(r rune) rune {
			if r == '\n' {
				return r
			}
			return 'x'
		}, s)
	})
	add := func(target string, at int) {
		if target == "" || scheme.MatchString(target) || strings.HasPrefix(target, "//") {
			return
		}
		targets = append(targets, target)
		lines = append(lines, strings.Count(body[:at], "\n")+1)
	}
	for _, re := range []*regexp.Regexp{inlineLink, refLink, htmlLink} {
		for _, m := range re.FindAllStringSubmatchIndex(body, -1) {
			add(body[m[2]:m[3]], m[0])
		}
	}
	return targets, lines
}

// TestReadmeAndDocsLinksResolve: every relative link of every Markdown file points
// at a file or folder that exists, and every #anchor at a heading of the
// Markdown file it names (GitHub's anchors), so a moved section breaks a
// test, not a reader's click.
func TestReadmeAndDocsLinksResolve(t *testing.T) {
	files := markdownFiles(t)
	texts := map[string]string{}
	for _, f := range files {
		texts[f] = readDoc(t, f)
	}
	checked := 0
	for _, f := range files {
		targets, lines := links(texts[f])
		for i, target := range targets {
			checked++
			p, frag, _ := strings.Cut(target, "#")
			file := f
			if p != "" {
				if strings.HasPrefix(p, "/") {
					file = path.Clean(strings.TrimPrefix(p, "/"))
				} else {
					file = path.Join(path.Dir(f), p)
				}
				if strings.HasPrefix(file, "../") {
					t.Errorf("%s:%d: link %q leaves the repository", f, lines[i], target)
					continue
				}
				if _, err := os.Stat(filepath.Join(repoRoot, file)); err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", f, lines[i], target, file)
					continue
				}
			}
			if frag == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			text, ok := texts[file]
			if !ok {
				text = readDoc(t, file)
			}
			if !anchors(text)[frag] {
				t.Errorf("%s:%d: link %q: %s has no heading with the anchor #%s", f, lines[i], target, file, frag)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d links checked in %d files: the link finder is broken", checked, len(files))
	}
}

func TestLinksFinder(t *testing.T) {
	text := "See [a](docs/a.md#x), `[not](a-link.md)`, ![img](b.svg \"title\") and [`cdc-outbox\nrepublish`](#re-publishing).\n" +
		"```sh\n[in](code.md)\n```\n[ref]: c.md\n<a href=\"d.md\">d</a> [web](https://example.com)\n"
	got, lines := links(text)
	want := []string{"docs/a.md#x", "b.svg", "#re-publishing", "c.md", "d.md"}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("links = %v, want %v", got, want)
	}
	if len(lines) != len(want) {
		t.Errorf("lines = %v", lines)
	}
}

// TestReadmeIsAFrontDoor: the README stays short and maps every page under
// docs/; the topics live on those pages.
func TestReadmeIsAFrontDoor(t *testing.T) {
	readme := readDoc(t, "README.md")
	if n := strings.Count(readme, "\n"); n > 250 {
		t.Errorf("README.md has %d lines; keep it a front door of at most 250 and put the topic on a page under docs/", n)
	}
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no pages under docs/: %v", err)
	}
	targets, _ := links(readme)
	for _, p := range pages {
		page := "docs/" + filepath.Base(p)
		if !slices.ContainsFunc(targets, func(t string) bool { return strings.HasPrefix(t, page) }) {
			t.Errorf("README.md does not link %s: add it to the map of the docs", page)
		}
		parts := strings.SplitN(readDoc(t, page), "\n\n", 3)
		if first := strings.ToLower(parts[min(1, len(parts)-1)]); !strings.HasPrefix(first, "for ") && !strings.Contains(first, "for whoever") {
			t.Errorf("%s does not begin by saying who it is for (\"For whoever ...\" after its title)", page)
		}
	}
}

// oldReadme is where each section of the README went when it became a
// front door (its 40 headings before, in order): the page, and the
// heading there when it changed.
var oldReadme = []struct{ heading, page, now string }{
	{"cdc-outbox", "README.md", ""},
	{"Quickstart", "docs/getting-started.md", ""},
	{"On this machine, without Docker", "docs/getting-started.md", ""},
	{"With Docker Compose", "docs/getting-started.md", ""},
	{"Writing events", "docs/records.md", ""},
	{"From Go: the libraries", "docs/libraries.md", "The modules"},
	{"Writing events: outbox", "docs/libraries.md", ""},
	{"Safe retries at the API: idempotency", "docs/libraries.md", ""},
	{"Consuming events", "docs/records.md", ""},
	{"Upgrading consumers to sources", "docs/libraries.md", ""},
	{"Run it", "docs/getting-started.md", "Getting started and running"},
	{"Prerequisites", "docs/getting-started.md", ""},
	{"Install", "docs/getting-started.md", ""},
	{"Start", "docs/getting-started.md", ""},
	{"PostgreSQL with TLS and a least-privilege role", "docs/getting-started.md", ""},
	{"What a record looks like", "docs/records.md", ""},
	{"Bad events", "docs/records.md", ""},
	{"A partitioned outbox", "docs/records.md", ""},
	{"The outbox is a table, not a name", "docs/records.md", ""},
	{"Flags", "docs/configuration.md", ""},
	{"Kafka with TLS and SASL", "docs/getting-started.md", ""},
	{"Configuration file", "docs/configuration.md", ""},
	{"Operating cdc-outbox", "docs/operating.md", ""},
	{"What to watch", "docs/operating.md", ""},
	{"Alerts", "docs/operating.md", ""},
	{"How a slot is lost, and what max_slot_wal_keep_size does", "docs/operating.md", ""},
	{"High availability", "docs/operating.md", ""},
	{"Re-publishing events: cdc-outbox republish", "docs/operating.md", ""},
	{"Decommissioning", "docs/operating.md", ""},
	{"Guarantees", "docs/guarantees.md", "In short"},
	{"Exactly-once delivery", "docs/guarantees.md", "Turning it on"},
	{"Performance", "docs/performance.md", ""},
	{"Against the walsender (make bench, latest.md)", "docs/performance.md", ""},
	{"Against Debezium Server (make bench-debezium, debezium.md)", "docs/performance.md", ""},
	{"How it reads, and where the CPU goes", "docs/performance.md", ""},
	{"PostgreSQL versions", "docs/getting-started.md", ""},
	{"Coming from Debezium", "docs/debezium.md", "Coming from Debezium's outbox event router"},
	{"Develop and test", "docs/development.md", ""},
	{"Prerequisites", "docs/development.md", ""},
	{"Test it", "docs/development.md", ""},
	{"Local servers", "docs/development.md", ""},
	{"Layout", "docs/development.md", ""},
}

// TestReadmeSectionsHaveAHome: every section of the README before it
// became a front door is still a heading of the page it moved to.
func TestReadmeSectionsHaveAHome(t *testing.T) {
	if len(oldReadme) != 42 {
		t.Fatalf("%d sections listed, want the 42 headings of the README before", len(oldReadme))
	}
	for _, s := range oldReadme {
		want := s.heading
		if s.now != "" {
			want = s.now
		}
		if !slices.Contains(headings(readDoc(t, s.page)), want) {
			t.Errorf("the README's section %q moved to %s as %q, which has no such heading", s.heading, s.page, want)
		}
	}
}
