package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The house rules of docs/architecture.md, checked: the command is flags,
// configuration and wiring; the internal packages know nothing of the
// command line; imports follow the data path.

// flagNames are the names of every flag of every command.
func flagNames() []string {
	names := []string{configFlag}
	names = append(names, runFlags(&runConfig{}).order...)
	names = append(names, statusFlags(&statusConfig{}).order...)
	names = append(names, republishFlags(&republishConfig{}).order...)
	names = append(names, lostEventsFlags(&lostEventsConfig{}).order...)
	slices.Sort(names)
	return slices.Compact(names)
}

// goFiles lists the non-test Go files under dir.
func goFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no Go files under %s: the check checks nothing", dir)
	}
	return files
}

// TestInternalKnowsNoFlags: no flag name (--slot, --on-bad-event) nor its
// environment variable appears in the internal packages, code or comments,
// outside tests. What to do about an error, with the flags to change, is
// said in advice.go; renaming a flag does not touch the data path.
func TestInternalKnowsNoFlags(t *testing.T) {
	var words []*regexp.Regexp
	for _, name := range flagNames() {
		words = append(words, regexp.MustCompile(`--`+regexp.QuoteMeta(name)+`([^a-z0-9-]|$)`), regexp.MustCompile(`\b`+envName(name)+`\b`))
	}
	for _, path := range goFiles(t, "../../internal") {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, w := range words {
				if w.MatchString(line) {
					t.Errorf("%s:%d names a flag (%s): return the facts, and say what to do in cmd/cdc-outbox/advice.go\n\t%s",
						path, i+1, strings.TrimRight(w.FindString(line), " .,;:)'\""), strings.TrimSpace(line))
				}
			}
		}
	}
}

// TestCommandFlagsExist: every --flag the command's own text names (help,
// advice, validation) is a flag it has, so a renamed flag cannot leave
// stale advice behind.
func TestCommandFlagsExist(t *testing.T) {
	known := append(flagNames(), "help", "version")
	flag := regexp.MustCompile(`--([a-z][a-z0-9-]*[a-z0-9])`)
	for _, path := range goFiles(t, ".") {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range flag.FindAllStringSubmatch(string(b), -1) {
			if !slices.Contains(known, m[1]) {
				t.Errorf("%s names --%s, which is no flag of cdc-outbox", path, m[1])
			}
		}
	}
}

// sqlText matches a string that is a query (a statement, or one that reads
// the catalog): the command runs none.
var sqlText = regexp.MustCompile(`^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|SHOW|CREATE|ALTER|DROP|COMMENT ON|TRUNCATE|START_REPLICATION)\s|(?i:\bfrom\s+pg_)`)

// TestNoSQLInCommand: the command holds no SQL and no way to run it; the
// queries are internal/replication's, shared by run, status and the
// monitor. (Advice may quote a statement for the operator to run: "run
// ALTER PUBLICATION ...", never a query of its own.)
func TestNoSQLInCommand(t *testing.T) {
	forbidden := []string{"github.com/jackc/pgx/v5", "github.com/jackc/pgx/v5/pgxpool", "github.com/jackc/pgx/v5/stdlib", "database/sql", "github.com/jackc/pglogrepl"}
	fset := token.NewFileSet()
	for _, path := range goFiles(t, ".") {
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); slices.Contains(forbidden, p) {
				t.Errorf("%s imports %s: queries belong in internal/replication", path, p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil && sqlText.MatchString(s) {
					t.Errorf("%s: SQL in the command: %.60q", fset.Position(lit.Pos()), s)
				}
			}
			return true
		})
	}
}

// allowedImports are the imports between the streamer's own packages: the
// pipeline joins the decoder, the mapping and the checkpoint (the sink it
// takes as an interface); the replication knows the decoder's relations;
// republish, the second way from the table to Kafka, reuses the mapping,
// the pipeline's bad-event records and the replication's catalog lookups;
// the rest import none of ours but the outbox contract, and metrics and the
// command are imported by no one. A new edge is a design decision: make it in docs/architecture.md
// and here.
var allowedImports = map[string][]string{
	"internal/checkpoint":  nil,
	"internal/decoder":     nil,
	"internal/mapping":     {"outbox/contract", "outbox/topic"},
	"internal/metrics":     nil,
	"internal/pipeline":    {"internal/checkpoint", "internal/decoder", "internal/mapping", "internal/shard", "outbox/contract"},
	"internal/replication": {"internal/decoder", "internal/shard", "outbox/pgname", "sql"},
	"internal/republish":   {"internal/mapping", "outbox/pgname", "internal/pipeline", "internal/replication"},
	"internal/relay": {"internal/checkpoint", "internal/decoder", "internal/mapping", "internal/pipeline", "internal/replication",
		"internal/shard", "internal/sink", "outbox/pgname"},
	"internal/shard":   nil,
	"internal/sink":    nil,
	"internal/testenv": nil,
	"internal/tracing": nil,
	"cmd/cdc-outbox": {"internal/checkpoint", "internal/decoder", "internal/mapping", "internal/metrics",
		"internal/pipeline", "internal/relay", "internal/replication", "internal/republish", "internal/shard", "internal/sink", "internal/tracing", "outbox/contract", "outbox/pgname",
		"schema"},
}

// TestImportGraph: go list's imports of the streamer's packages (tests
// aside) are the allowed ones.
func TestImportGraph(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const module = "github.com/cdc-outbox/cdc-outbox/"
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Imports " "}}`, "./internal/...", "./cmd/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(strings.TrimPrefix(line, module), ":")
		if pkg == "internal/modules" {
			continue // tests only
		}
		seen++
		allowed, ok := allowedImports[pkg]
		if !ok {
			t.Errorf("package %s is not in the import table: say where it stands in docs/architecture.md and here", pkg)
			continue
		}
		for _, imp := range strings.Fields(imports) {
			own, ok := strings.CutPrefix(imp, module)
			if ok && !slices.Contains(allowed, own) {
				t.Errorf("%s imports %s: not an edge of the data path (docs/architecture.md)", pkg, own)
			}
		}
	}
	if seen < len(allowedImports) {
		t.Errorf("go list showed %d of the %d packages in the table:\n%s", seen, len(allowedImports), out)
	}
}

// maxCommittedFile is the size above which a committed file is taken for a
// build output or a data dump rather than source: the largest source file
// is a go.sum of about 80 KB.
const maxCommittedFile = 1 << 20

// binaryMagic are the first bytes of executables and object files: ELF
// (Linux, including Go test binaries), Mach-O (32 and 64 bit, both byte
// orders, and universal), PE (Windows) and WebAssembly.
var binaryMagic = [][]byte{
	[]byte("\x7fELF"),
	{0xfe, 0xed, 0xfa, 0xce}, {0xce, 0xfa, 0xed, 0xfe},
	{0xfe, 0xed, 0xfa, 0xcf}, {0xcf, 0xfa, 0xed, 0xfe},
	{0xca, 0xfe, 0xba, 0xbe},
	[]byte("MZ"),
	[]byte("\x00asm"),
	[]byte("!<arch>\n"),
}

// TestNoBinaryCommitted: the repository holds no build output (a test
// binary such as mapping.test once sat at its root, 8 MB): no committed
// file is an executable or object file, and none is larger than
// maxCommittedFile. .gitignore keeps the usual ones out; this catches the
// rest, and a git add -f.
func TestNoBinaryCommitted(t *testing.T) {
	root, err := exec.Command("git", "-C", "../..", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skip("not a git checkout: no committed files to check")
	}
	top := strings.TrimSpace(string(root))
	out, err := exec.Command("git", "-C", top, "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	if len(files) < 100 {
		t.Fatalf("git ls-files listed %d files: the check checks nothing", len(files))
	}
	for _, name := range files {
		path := filepath.Join(top, name)
		info, err := os.Lstat(path)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree, or a symbolic link
		}
		if info.Size() > maxCommittedFile {
			t.Errorf("%s is committed and %d bytes large: build outputs and dumps stay out of the repository (git rm --cached it; .gitignore)", name, info.Size())
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		head := make([]byte, 8)
		n, _ := f.Read(head)
		f.Close()
		for _, magic := range binaryMagic {
			if bytes.HasPrefix(head[:n], magic) {
				t.Errorf("%s is a committed executable or object file: build outputs stay out of the repository (git rm --cached it; .gitignore)", name)
				break
			}
		}
	}
}

// TestServerVariablesThroughRequire: a test reads where a server is
// (CDC_OUTBOX_TEST_*) only through internal/testenv or a library's
// pgtest, whose Require skips under go test -short and fails when the
// variable is unset. A test that read one itself stopped make test-unit
// (TestTracingThroughJaeger and CDC_OUTBOX_TEST_JAEGER_CTL).
func TestServerVariablesThroughRequire(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir("../..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".local" || d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "os" || (sel.Sel.Name != "Getenv" && sel.Sel.Name != "LookupEnv") {
				return true
			}
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && strings.HasPrefix(lit.Value, `"CDC_OUTBOX_TEST_`) {
				t.Errorf("%s: a test reads %s itself: use testenv (or pgtest.Require), which skips under -short and fails when it is unset", fset.Position(call.Pos()), lit.Value)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("found %d test files: the check checks nothing", checked)
	}
}
