package consume

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// memberEnv names what a member process (see TestMain) consumes:
// "database URL|brokers|group|topic|instance id".
const memberEnv = "CONSUME_TEST_MEMBER"

// TestMain runs the test binary as a consumer group member when memberEnv
// is set, so that a test can SIGKILL a member: a process that dies without
// leaving the group, as after kill -9 or an OOM kill.
func TestMain(m *testing.M) {
	if spec := os.Getenv(memberEnv); spec != "" {
		os.Exit(runMember(spec))
	}
	os.Exit(m.Run())
}

// staticSession is the session timeout of the static membership test: the
// time a dead member keeps its partitions unless a replacement takes over.
const staticSession = 60 * time.Second

func runMember(spec string) int {
	f := strings.Split(spec, "|")
	if len(f) != 5 {
		fmt.Fprintln(os.Stderr, "member: bad", memberEnv, spec)
		return 2
	}
	pool, err := pgxpool.New(context.Background(), f[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "member:", err)
		return 1
	}
	c, err := New(Config{
		Brokers: strings.Split(f[1], ","), Group: f[2], Topics: []string{f[3]}, InstanceID: f[4],
		DB: pool, Handler: bill, Logger: testLogger(),
		ExtraOpts: []kgo.Opt{kgo.SessionTimeout(staticSession)},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "member:", err)
		return 1
	}
	if err := c.Run(context.Background()); err != nil { // until killed
		fmt.Fprintln(os.Stderr, "member:", err)
		return 1
	}
	return 0
}

// TestStaticMembershipResumesAtOnce: a member with an InstanceID is
// SIGKILLed; its replacement, joining with the same id, takes over its
// partitions at once instead of waiting for the group to drop the dead
// member. The session timeout is 60s, so without static membership the
// replacement would get no partition for about a minute: the 20s bound
// cannot be met by luck, and leaves room for a saturated machine.
func TestStaticMembershipResumesAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 3)
	const instance = "billing-0"
	batch := func(from int) []event {
		var evs []event
		for i := from; i < from+30; i++ {
			evs = append(evs, event{id: fmt.Sprint(i), key: fmt.Sprintf("acct-%d", i%11), amount: i, source: "payments"})
		}
		return evs
	}
	e.produce(batch(0)...)

	member := exec.Command(os.Args[0], "-test.run=^$")
	member.Env = append(os.Environ(), memberEnv+"="+strings.Join([]string{e.url, strings.Join(kafkaBrokers(t), ","), e.group, e.topic, instance}, "|"))
	member.Stdout, member.Stderr = os.Stderr, os.Stderr
	if err := member.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- member.Wait() }()
	t.Cleanup(func() { _ = member.Process.Kill(); <-exited })
	waitRows(t, e, 30, 90*time.Second, "the first member to process the first 30 events")

	if err := member.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err == nil {
		t.Fatal("the member exited cleanly; want it killed")
	}
	exited <- nil // for the cleanup
	e.produce(batch(30)...)

	cfg := e.config(bill)
	cfg.InstanceID = instance
	cfg.ExtraOpts = []kgo.Opt{kgo.SessionTimeout(staticSession)}
	replacement := e.consumer(cfg)
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- replacement.Run(ctx) }()
	waitRows(t, e, 60, 20*time.Second, "the replacement with the same InstanceID to process the 30 new events (without static membership it waits for the 60s session timeout)")
	took := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("replacement Run: %v", err)
	}
	t.Logf("the replacement processed the new events %v after it started (session timeout %v)", took.Round(10*time.Millisecond), staticSession)
	if rows, distinct := e.billing(); rows != 60 || distinct != 60 {
		t.Errorf("billing: %d rows, %d distinct; want 60 and 60", rows, distinct)
	}
}

// waitRows polls until billing has want rows, failing after timeout with
// what it last saw.
func waitRows(t *testing.T, e *env, want int, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		rows, _ := e.billing()
		if rows >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %d of %d billing rows", timeout, what, rows, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
