package chaos

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

// The servers, proxies and binary of the suite, set once by TestMain.
var env struct {
	pg    *testenv.Postgres
	kafka *testenv.Kafka
	// kafkaAddr is the broker's real listener; the broker advertises
	// brokerProxy's address, so the connector's every connection to Kafka
	// goes through the proxy. The suite's own clients dial kafkaAddr
	// directly (kafkaDialer) and are never cut.
	kafkaAddr   string
	brokerProxy *Proxy
	pgProxy     *Proxy
	bin         string
	binDir      string // removed at exit when the suite built the binary
	// skip is set when the suite cannot run here (external servers).
	skip string
}

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

// runSuite owns the servers so its deferred cleanups happen before os.Exit.
func runSuite(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		// The checker's and the harness's own tests need no server.
		env.skip = "the chaos suite starts PostgreSQL and Kafka; not in -short"
		return m.Run()
	}
	if os.Getenv(testenv.EnvPGDSN) != "" || os.Getenv(testenv.EnvKafkaBrokers) != "" {
		// Every fault needs the harness to own the servers.
		env.skip = "the chaos suite kills and restarts its servers; unset " + testenv.EnvPGDSN + " and " + testenv.EnvKafkaBrokers
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var err error
	env.brokerProxy, err = NewKafkaProxy("kafka", "")
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 1
	}
	defer env.brokerProxy.Close()

	type result struct {
		took time.Duration
		err  error
	}
	binDone := make(chan error, 1)
	go func() { binDone <- buildBinary(ctx) }()
	pgDone := make(chan result, 1)
	go func() {
		start := time.Now()
		var err error
		env.pg, err = testenv.StartPostgres(ctx, testenv.PostgresOptions{})
		pgDone <- result{time.Since(start), err}
	}()
	// The broker must advertise the proxy, whose target (the real listener
	// that StartKafka picks) is learned from the broker's configuration
	// file as soon as it is written: the readiness probe of StartKafka
	// already goes through the proxy.
	discCtx, stopDisc := context.WithCancel(ctx)
	discDone := make(chan error, 1)
	go func() { discDone <- discoverKafkaListener(discCtx, env.brokerProxy) }()
	kStart := time.Now()
	var kErr error
	// Auto-creation is off, as on a locked-down cluster: the suite creates
	// the outbox topics, the connector its own (the quarantine state and
	// positions topics) at start.
	env.kafka, kErr = testenv.StartKafka(ctx, testenv.KafkaOptions{Properties: map[string]string{
		"advertised.listeners":      "PLAINTEXT://" + env.brokerProxy.Addr(),
		"auto.create.topics.enable": "false",
		// ops-parking-retention waits for retention to delete parked
		// records; the default check runs every 5 minutes.
		"log.retention.check.interval.ms": "1000",
		// pg-restore-compacted waits for the cleaner; an idle cleaner
		// looks for work every 15 s by default.
		"log.cleaner.backoff.ms": "1000",
	}})
	kTook := time.Since(kStart)
	stopDisc()
	discErr := <-discDone
	pgRes := <-pgDone
	binErr := <-binDone
	if env.binDir != "" {
		defer os.RemoveAll(env.binDir)
	}

	if env.pg != nil {
		defer env.pg.Close()
	}
	if env.kafka != nil {
		defer env.kafka.Close()
	}
	var failed bool
	for _, err := range []error{pgRes.err, kErr, binErr} {
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
			failed = true
		}
	}
	if failed {
		return 1
	}
	env.kafkaAddr = env.kafka.Brokers()[0]
	if discErr != nil || env.brokerProxy.Target() != env.kafkaAddr {
		fmt.Fprintf(os.Stderr, "chaos: broker proxy target %q, broker listens on %s (%v)\n",
			env.brokerProxy.Target(), env.kafkaAddr, discErr)
		return 1
	}
	env.pgProxy, err = NewProxy("postgres", fmt.Sprintf("127.0.0.1:%d", env.pg.Port()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 1
	}
	defer env.pgProxy.Close()

	// On Ctrl-C or SIGTERM stop the servers and remove their directories
	// before dying; Pdeathsig alone would kill them but leave the files.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	defer func() { signal.Stop(sigs); close(done) }()
	go func() {
		select {
		case sig := <-sigs:
			fmt.Fprintf(os.Stderr, "chaos: %v, stopping servers\n", sig)
			env.kafka.Close()
			env.pg.Close()
			os.Exit(130)
		case <-done:
		}
	}()

	fmt.Printf("chaos: PostgreSQL %s at 127.0.0.1:%d (started in %.1fs), Apache Kafka %s at %s (started in %.1fs); %s; %s; binary %s\n",
		env.pg.Version(), env.pg.Port(), pgRes.took.Seconds(), env.kafka.Version(), env.kafkaAddr, kTook.Seconds(),
		env.brokerProxy, env.pgProxy, env.bin)
	return m.Run()
}

// buildBinary sets env.bin to $OUTBOX_CDC_BIN or builds the connector.
func buildBinary(ctx context.Context) error {
	if p := os.Getenv(cdctest.EnvBin); p != "" {
		env.bin = p
		return nil
	}
	dir, err := os.MkdirTemp("", "outbox-cdc-chaos-bin-")
	if err != nil {
		return err
	}
	env.binDir = dir
	env.bin = filepath.Join(dir, "outbox-cdc")
	return cdctest.Build(ctx, "go", env.bin)
}

// discoverKafkaListener finds the server.properties that StartKafka writes
// for the broker advertising p, and points p at the broker's real
// PLAINTEXT listener.
func discoverKafkaListener(ctx context.Context, p *Proxy) error {
	want := "PLAINTEXT://" + p.Addr()
	pattern := filepath.Join(os.TempDir(), "outbox-kafka-*", "server.properties")
	for {
		matches, _ := filepath.Glob(pattern)
		for _, path := range matches {
			props := readProperties(path)
			if props["advertised.listeners"] != want {
				continue
			}
			for l := range strings.SplitSeq(props["listeners"], ",") {
				if addr, ok := strings.CutPrefix(strings.TrimSpace(l), "PLAINTEXT://"); ok {
					if _, _, err := net.SplitHostPort(addr); err != nil {
						return fmt.Errorf("listener %q in %s: %w", addr, path, err)
					}
					p.SetTarget(addr)
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return errors.New("no broker configuration advertising " + want)
		case <-time.After(20 * time.Millisecond): // poll interval of the broker's configuration files
		}
	}
}

func readProperties(path string) map[string]string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	props := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			props[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return props
}

// kafkaDialer lets the suite's own Kafka clients reach the broker directly:
// the broker advertises the proxy, which the faults cut.
func kafkaDialer(ctx context.Context, network, host string) (net.Conn, error) {
	if host == env.brokerProxy.Addr() {
		host = env.kafkaAddr
	}
	var d net.Dialer
	return d.DialContext(ctx, network, host)
}

// cleanEnv is the environment without OUTBOX_CDC_ variables: the connector
// rejects unknown ones (OUTBOX_CDC_CHAOS, say).
func cleanEnv() []string { return cdctest.CleanEnv() }
