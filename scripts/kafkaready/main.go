// Command kafkaready waits until a Kafka broker answers a metadata request.
// scripts/kafka.sh uses it so that "started" means "serving", not "a process
// exists".
//
// With -sasl-brokers it also makes sure the SCRAM-SHA-512 user -scram-user
// can log in on that (SASL_SSL) listener with the password in
// -scram-password-file, verifying the broker's certificate with -ca-file:
// when the login is refused, it sets the user's password through the admin
// API of the PLAINTEXT listener (creating the user) and waits until the
// login succeeds. Doing it after start, rather than when the log dir is
// formatted, works the same for a state folder made before the listener
// existed.
//
// With -pid it gives up as soon as that process (the broker) has exited:
// a broker that could not start (a port taken before it bound it) is not
// waited for until the timeout. It then exits with status 3, and
// scripts/kafka.sh reads the cause from the broker's log.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated bootstrap brokers (PLAINTEXT)")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	saslBrokers := flag.String("sasl-brokers", "", "comma-separated SASL_SSL brokers; empty skips the SASL check")
	caFile := flag.String("ca-file", "", "PEM CA certificate that signed the SASL_SSL listener's certificate")
	user := flag.String("scram-user", "", "SCRAM-SHA-512 user to log in as (and create)")
	passwordFile := flag.String("scram-password-file", "", "file holding the user's password")
	pid := flag.Int("pid", 0, "the broker's process id: stop waiting (status 3) once it has exited; 0 waits the whole timeout")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	plain := []kgo.Opt{kgo.SeedBrokers(strings.Split(*brokers, ",")...)}
	wait(ctx, *brokers, *timeout, *pid, func() error { return ping(ctx, plain) })
	if *saslBrokers == "" {
		return
	}

	secure, password, err := saslOpts(*saslBrokers, *caFile, *user, *passwordFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kafkaready: %v\n", err)
		os.Exit(1)
	}
	upserted := false
	wait(ctx, *saslBrokers, *timeout, *pid, func() error {
		err := ping(ctx, secure)
		if errors.Is(err, kerr.SaslAuthenticationFailed) && !upserted {
			// A new state folder, an older one, or a changed password
			// file: set the password. The broker applies it through its
			// metadata log, so the login that follows may fail a few more
			// times first.
			if err := upsert(ctx, plain, *user, password); err != nil {
				return fmt.Errorf("set the SCRAM-SHA-512 password of %s: %w", *user, err)
			}
			upserted = true
		}
		return err
	})
}

// exited says whether process pid has exited: it is gone, or a zombie its
// parent has not reaped yet.
func exited(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses and may
	// hold spaces or parentheses itself.
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || strings.HasPrefix(string(stat[i+1:]), " Z")
}

// wait calls try until it succeeds or ctx ends, then exits with the last
// error; it exits with status 3 as soon as process pid (unless 0), the
// broker, has exited.
func wait(ctx context.Context, what string, timeout time.Duration, pid int, try func() error) {
	for {
		if pid > 0 && exited(pid) {
			fmt.Fprintf(os.Stderr, "kafkaready: the broker (pid %d) exited before %s answered\n", pid, what)
			os.Exit(3)
		}
		last := try()
		if last == nil {
			return
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "kafkaready: %s not ready after %s: %v\n", what, timeout, last)
			os.Exit(1)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func saslOpts(brokers, caFile, user, passwordFile string) ([]kgo.Opt, string, error) {
	if caFile == "" || user == "" || passwordFile == "" {
		return nil, "", errors.New("-sasl-brokers needs -ca-file, -scram-user and -scram-password-file")
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, "", err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, "", fmt.Errorf("%s: no PEM certificate", caFile)
	}
	b, err := os.ReadFile(passwordFile)
	if err != nil {
		return nil, "", err
	}
	password := strings.TrimRight(string(b), "\r\n")
	if password == "" {
		return nil, "", fmt.Errorf("%s is empty", passwordFile)
	}
	return []kgo.Opt{
		kgo.SeedBrokers(strings.Split(brokers, ",")...),
		kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}),
		kgo.SASL(scram.Auth{User: user, Pass: password}.AsSha512Mechanism()),
	}, password, nil
}

func upsert(ctx context.Context, opts []kgo.Opt, user, password string) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := kadm.NewClient(cl).AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{
		User: user, Mechanism: kadm.ScramSha512, Iterations: 8192, Password: password,
	}})
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.Err != nil {
			return fmt.Errorf("%w %s", r.Err, r.ErrMessage)
		}
	}
	return nil
}

func ping(ctx context.Context, opts []kgo.Opt) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := kadm.NewClient(cl).BrokerMetadata(ctx)
	if err != nil {
		return err
	}
	if len(m.Brokers) == 0 {
		return fmt.Errorf("metadata lists no brokers")
	}
	if m.Controller < 0 {
		return fmt.Errorf("no active controller yet")
	}
	return nil
}
