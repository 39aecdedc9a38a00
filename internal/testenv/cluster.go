package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// ClusterOptions are what a test's own PostgreSQL differs in from the shared
// one.
type ClusterOptions struct {
	// Config lines are appended to postgresql.conf (after the settings of
	// scripts/postgres.sh, so they win): "ssl = on",
	// "max_slot_wal_keep_size = '1MB'".
	Config []string
	// HBA lines are put at the top of pg_hba.conf. The first matching line
	// decides, so they override the default (trust from 127.0.0.1 for
	// everyone) for the roles and connection types they name, and the
	// superuser of URL keeps trust.
	HBA []string
	// Files are written into the data folder before the first start, owned
	// by the server's user with mode 0600 (PostgreSQL refuses a private key
	// that others can read). Name them relative to the data folder, e.g.
	// "server.key", and refer to them so in Config.
	Files map[string][]byte
	// Major is the PostgreSQL major to run (14 to 18), for tests of what
	// one version has (failover slots: 17+); 0 runs the shared server's
	// (PG_VERSION of the environment). scripts/postgres.sh takes the
	// machine's binaries of it, or downloads them once (as the matrix of
	// make test does), installing pip first when it must
	// (scripts/deps.sh).
	Major int
	// Upstream is, for Standby, the URL the standby takes its base backup
	// from and replicates from (primary_conninfo): the primary's URL when
	// empty; a proxy's, to cut the standby off (NewProxy).
	Upstream string
}

// PostgresCluster is a PostgreSQL cluster that belongs to one test.
type PostgresCluster struct {
	t      testing.TB
	script string
	env    []string
	// URL is the superuser's URL of the cluster's postgres database (trust,
	// no TLS).
	URL string
	// DataDir is the cluster's data folder.
	DataDir string
	// Major is the cluster's PostgreSQL major version.
	Major int
}

// Cluster starts a PostgreSQL cluster of the test's own, for settings the
// shared server must not have (TLS, a small max_slot_wal_keep_size), and
// destroys it at cleanup: server stopped, data folder removed.
//
// It runs the control script of the shared server
// (CDC_OUTBOX_TEST_POSTGRES_CTL, scripts/postgres.sh) with its state moved to
// a temporary folder (CDC_OUTBOX_LOCAL), so the cluster is built from the
// same server binaries with the same base settings (wal_level=logical, TCP
// on 127.0.0.1 only, a free port), then changed as opts say before its
// first start. Like every integration test, it fails without the script
// unless -short.
func Cluster(t testing.TB, opts ClusterOptions) *PostgresCluster {
	t.Helper()
	c := newCluster(t, opts.Major)
	c.Control("init")
	return c.setUp(opts)
}

// newCluster is a cluster's state folder and environment, not yet made;
// the cleanup that destroys it is registered before it exists, so that a
// failure half-way (initdb ran, start failed) still removes what was made.
func newCluster(t testing.TB, major int) *PostgresCluster {
	t.Helper()
	c := &PostgresCluster{
		t:      t,
		script: require(t, envPostgresCtl),
		env:    append(os.Environ(), "CDC_OUTBOX_LOCAL="+t.TempDir()),
	}
	if major != 0 {
		c.env = append(c.env, fmt.Sprintf("PG_VERSION=%d", major))
		deps := exec.Command(filepath.Join(filepath.Dir(c.script), "deps.sh"))
		deps.Env = c.env
		if out, err := deps.CombinedOutput(); err != nil {
			t.Fatalf("scripts/deps.sh for PostgreSQL %d: %v\n%s", major, err, out)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			if out, err := c.run("logs"); err == nil {
				t.Logf("log of the test's own PostgreSQL %s (last lines):\n%s", c.URL, tail(out, 4000))
			}
		}
		if out, err := c.run("destroy"); err != nil {
			t.Errorf("destroy the test's own PostgreSQL: %v\n%s", err, out)
		}
	})
	return c
}

// setUp configures a made cluster as opts say, starts it and reads its
// address and version.
func (c *PostgresCluster) setUp(opts ClusterOptions) *PostgresCluster {
	t := c.t
	t.Helper()
	out, err := c.run("datadir")
	if err != nil {
		t.Fatalf("%s datadir: %v\n%s", c.script, err, out)
	}
	c.DataDir = strings.TrimSpace(out)
	if err := c.configure(opts); err != nil {
		t.Fatalf("configure the test's own PostgreSQL in %s: %v", c.DataDir, err)
	}
	c.Control("start")
	out, err = c.run("url")
	if err != nil {
		t.Fatalf("%s url: %v\n%s", c.script, err, out)
	}
	c.URL = strings.TrimSpace(out)
	c.Major = ServerMajor(t, c.URL)
	if opts.Major != 0 && c.Major != opts.Major {
		t.Fatalf("asked for PostgreSQL %d, the test's own cluster runs %d", opts.Major, c.Major)
	}
	return c
}

// Standby makes a streaming standby of c, a cluster of the test's own, and
// starts it (scripts/postgres.sh standby): a base backup through the
// physical replication slot slot, which it creates on c, with
// hot_standby_feedback = on and, on PostgreSQL 17 and newer,
// sync_replication_slots = on, so c's failover slots are synchronized to
// it. opts.Config and opts.HBA are added as for Cluster; opts.Major is c's;
// opts.Upstream, when set, is where it replicates from instead of c.URL.
// It is destroyed at cleanup.
func (c *PostgresCluster) Standby(slot string, opts ClusterOptions) *PostgresCluster {
	c.t.Helper()
	opts.Major = c.Major
	upstream := c.URL
	if opts.Upstream != "" {
		upstream = opts.Upstream
	}
	s := newCluster(c.t, c.Major)
	s.Control("standby", upstream, slot)
	return s.setUp(opts)
}

// Control runs the cluster's control script: start, stop, restart, kill,
// promote (a standby).
func (c *PostgresCluster) Control(action string, args ...string) {
	c.t.Helper()
	if out, err := c.run(action, args...); err != nil {
		c.t.Fatalf("%s %s (the test's own PostgreSQL): %v\n%s", c.script, action, err, out)
	}
}

func (c *PostgresCluster) run(action string, args ...string) (string, error) {
	cmd := exec.Command(c.script, append([]string{action}, args...)...)
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// configure writes opts into the data folder. Every file is made the
// server's (the data folder's owner): when tests run as root, the script
// runs the server as the postgres user.
func (c *PostgresCluster) configure(opts ClusterOptions) error {
	fi, err := os.Stat(c.DataDir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("no owner for %s on this system", c.DataDir)
	}
	uid, gid := int(st.Uid), int(st.Gid)
	write := func(name string, data []byte) error {
		path := filepath.Join(c.DataDir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return err
		}
		// WriteFile keeps the mode of a file that exists; set it either way.
		if err := os.Chmod(path, 0o600); err != nil {
			return err
		}
		if os.Getuid() == uid {
			return nil
		}
		return os.Chown(path, uid, gid)
	}
	for name, data := range opts.Files {
		if err := write(name, data); err != nil {
			return err
		}
	}
	if len(opts.Config) > 0 {
		conf, err := os.ReadFile(filepath.Join(c.DataDir, "postgresql.conf"))
		if err != nil {
			return err
		}
		conf = append(conf, "\n# --- testenv.Cluster ---\n"+strings.Join(opts.Config, "\n")+"\n"...)
		if err := write("postgresql.conf", conf); err != nil {
			return err
		}
	}
	if len(opts.HBA) > 0 {
		hba, err := os.ReadFile(filepath.Join(c.DataDir, "pg_hba.conf"))
		if err != nil {
			return err
		}
		hba = append([]byte("# --- testenv.Cluster: first match wins ---\n"+strings.Join(opts.HBA, "\n")+"\n\n"), hba...)
		if err := write("pg_hba.conf", hba); err != nil {
			return err
		}
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
