package testenv

import (
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
)

// Psql runs a SQL file with psql against url, the way an administrator
// runs the files in sql/: ON_ERROR_STOP, and vars as psql variables
// (-v name=value). It fails the test on error and returns psql's output.
// psql is taken from PATH, else from the newest /usr/lib/postgresql/*/bin
// (Debian's server packages bring it).
func Psql(t testing.TB, url, file string, vars map[string]string) string {
	t.Helper()
	bin, err := exec.LookPath("psql")
	if err != nil {
		found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
		if len(found) == 0 {
			t.Fatal("psql not found on PATH nor in /usr/lib/postgresql/*/bin (Debian: apt-get install postgresql-client)")
		}
		// /usr/lib/postgresql/<major>/bin/psql: the highest major.
		major := func(p string) int { n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p)))); return n }
		sort.Slice(found, func(i, j int) bool { return major(found[i]) < major(found[j]) })
		bin = found[len(found)-1]
	}
	args := []string{"--no-psqlrc", "--quiet", "-v", "ON_ERROR_STOP=1", "--dbname", url, "--file", file}
	for k, v := range vars {
		args = append(args, "-v", k+"="+v)
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("psql -f %s: %v\n%s", file, err, out)
	}
	return string(out)
}
