package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfileCopiesReplacedModules: go.mod replaces the library modules
// with their directories, so `go mod download` in the image needs each of
// their go.mod files before it runs, or the build breaks.
func TestDockerfileCopiesReplacedModules(t *testing.T) {
	mod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	dirs := regexp.MustCompile(`(?m)=> \./(\S+)$`).FindAllStringSubmatch(string(mod), -1)
	if len(dirs) == 0 {
		t.Fatal("go.mod replaces no module with a directory; this test checks nothing")
	}
	copied := map[string]bool{}
	for _, in := range dockerfile(t) {
		if in[0] == "RUN" && strings.Contains(in[1], "go mod download") {
			for _, d := range dirs {
				if !copied[d[1]] {
					t.Errorf("the Dockerfile runs go mod download before it copies %s/go.mod", d[1])
				}
			}
			return
		}
		if in[0] == "COPY" {
			for _, f := range strings.Fields(in[1]) {
				if dir, ok := strings.CutSuffix(f, "/go.mod"); ok {
					copied[dir] = true
				}
			}
		}
	}
	t.Error("the Dockerfile has no RUN go mod download")
}
