// Package integration runs outbox-cdc against real PostgreSQL and Apache
// Kafka servers started by internal/testenv.
package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

// Shared servers, set once by TestMain before any test runs.
var (
	pgServer    *testenv.Postgres
	kafkaServer *testenv.Kafka
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

// run owns the servers so its deferred cleanups happen before os.Exit.
func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// Start both servers at once: Kafka's JVM dominates, PostgreSQL fits
	// inside its startup time.
	type result struct {
		took time.Duration
		err  error
	}
	pgDone := make(chan result, 1)
	go func() {
		start := time.Now()
		var err error
		pgServer, err = testenv.StartPostgres(ctx, testenv.PostgresOptions{})
		pgDone <- result{time.Since(start), err}
	}()
	kStart := time.Now()
	var kErr error
	// The OAUTH listener costs nothing at start; its sessions end with
	// their token (connections.max.reauth.ms), for cloudauth_test.go.
	kafkaServer, kErr = testenv.StartKafka(ctx, testenv.KafkaOptions{OAuthBearer: &testenv.KafkaOAuthBearer{MaxReauth: time.Minute}})
	kTook := time.Since(kStart)
	pgRes := <-pgDone

	if pgServer != nil {
		defer pgServer.Close()
	}
	if kafkaServer != nil {
		defer kafkaServer.Close()
	}
	// Never skip silently: a missing server is a failed run.
	if pgRes.err != nil || kErr != nil {
		for _, err := range []error{pgRes.err, kErr} {
			if err != nil {
				fmt.Fprintf(os.Stderr, "integration: %v\n", err)
			}
		}
		return 1
	}

	// On Ctrl-C or SIGTERM stop the servers and remove their directories
	// before dying; Pdeathsig alone would kill them but leave the files.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		sig := <-sigs
		fmt.Fprintf(os.Stderr, "integration: %v, stopping servers\n", sig)
		kafkaServer.Close()
		pgServer.Close()
		os.Exit(130)
	}()

	fmt.Printf("integration: %s, %s\n",
		describe(strings.TrimSpace("PostgreSQL "+pgServer.Version()), fmt.Sprintf("127.0.0.1:%d", pgServer.Port()), pgServer.External(), pgRes.took),
		describe(strings.TrimSpace("Apache Kafka "+kafkaServer.Version()), strings.Join(kafkaServer.Brokers(), ","), kafkaServer.External(), kTook))
	return m.Run()
}

func describe(name, addr string, external bool, took time.Duration) string {
	if external {
		return fmt.Sprintf("%s at %s (external)", name, addr)
	}
	return fmt.Sprintf("%s at %s (started in %.1fs)", name, addr, took.Seconds())
}

var (
	unsafeChars = regexp.MustCompile(`[^a-z0-9_]+`)
	dbCounter   atomic.Int64
)

// newDatabase creates a fresh database named after the test and returns its
// DSN. Names are lowercased, limited to PostgreSQL's 63 bytes and made unique
// with a counter, so subtests and -count=N runs never collide.
func newDatabase(t *testing.T) string {
	t.Helper()
	name := strings.Trim(unsafeChars.ReplaceAllString(strings.ToLower(t.Name()), "_"), "_")
	suffix := fmt.Sprintf("_%d_%d", os.Getpid(), dbCounter.Add(1))
	if limit := 63 - len(suffix); len(name) > limit {
		name = name[:limit]
	}
	name += suffix
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, err := pgServer.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatalf("new database: %v", err)
	}
	return dsn
}

// newTopic creates a topic with a random name and the given number of
// partitions, and deletes it when the test ends.
func newTopic(t *testing.T, partitions int) string {
	t.Helper()
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	topic := "it-" + hex.EncodeToString(suffix)
	createTopic(t, topic, partitions)
	return topic
}

// createTopic creates topic with n partitions and deletes it when the test
// ends.
func createTopic(t *testing.T, topic string, n int) {
	t.Helper()
	adm := newAdmin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, int32(n), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cdctest.DeleteTopics(ctx, adm, topic); err != nil {
			t.Logf("%v", err)
		}
	})
}

// newAdmin returns an admin client for the shared broker, closed when the
// test ends.
func newAdmin(t *testing.T) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}
