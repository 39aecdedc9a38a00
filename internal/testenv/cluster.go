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
	c := &PostgresCluster{
		t:      t,
		script: require(t, envPostgresCtl),
		env:    append(os.Environ(), "CDC_OUTBOX_LOCAL="+t.TempDir()),
	}
	// Registered before the cluster exists, so that a failure half-way
	// (initdb ran, start failed) still removes what was made.
	t.Cleanup(func() {
		if t.Failed() {
			if out, err := c.run("logs"); err == nil {
				t.Logf("log of the test's own PostgreSQL (last lines):\n%s", tail(out, 4000))
			}
		}
		if out, err := c.run("destroy"); err != nil {
			t.Errorf("destroy the test's own PostgreSQL: %v\n%s", err, out)
		}
	})
	c.Control("init")
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
	return c
}

// Control runs the cluster's control script: start, stop, restart, kill.
func (c *PostgresCluster) Control(action string) {
	c.t.Helper()
	if out, err := c.run(action); err != nil {
		c.t.Fatalf("%s %s (the test's own PostgreSQL): %v\n%s", c.script, action, err, out)
	}
}

func (c *PostgresCluster) run(action string) (string, error) {
	cmd := exec.Command(c.script, action)
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
