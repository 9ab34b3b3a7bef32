// Package contracts_test proves the contracts package against a real schema
// registry: Apicurio Registry's Confluent API, started by internal/testenv
// (no PostgreSQL or Kafka). srfake, which the unit tests use, answers every
// compatibility check with "compatible"; Apicurio checks for real.
package contracts_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// registry is the Apicurio every test but the outage test shares; each test
// uses subjects of its own (uniqueTopic).
var registry *testenv.Registry

func TestMain(m *testing.M) { os.Exit(run(m)) }

// run starts the registry and stops it after the tests, in a function so
// the deferred Close runs before os.Exit.
func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	var err error
	registry, err = testenv.StartRegistry(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/contracts:", err)
		return 1
	}
	defer registry.Close()
	fmt.Fprintf(os.Stderr, "test/contracts: Apicurio Registry %s ready in %s at %s\n",
		registry.Version(), time.Since(start).Round(time.Millisecond), registry.URL())
	return m.Run()
}

// testCtx is every test's deadline.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// uniqueTopic keeps the subjects of each test (and each run against a
// long-lived registry) apart.
func uniqueTopic(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "." + hex.EncodeToString(b)
}

func newContracts(t *testing.T, url string, cfg contracts.Config) *contracts.Contracts {
	t.Helper()
	cfg.Registry.URL = url
	c, err := contracts.New(cfg)
	if err != nil {
		t.Fatalf("contracts.New: %v", err)
	}
	return c
}

const orderV1 = `{
  "type": "object",
  "properties": {"id": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
  "required": ["id", "qty"]
}`

// orderV2 adds a required field: under BACKWARD a consumer on v2 cannot
// read v1 events, so the registry must refuse it.
const orderV2 = `{
  "type": "object",
  "properties": {"id": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}, "currency": {"type": "string"}},
  "required": ["id", "qty", "currency"]
}`
