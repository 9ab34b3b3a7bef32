package contracts_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/internal/cli"
)

// cliConfig is a configuration with contracts against the test registry;
// PostgreSQL and Kafka are never contacted by contracts register.
func cliConfig(t *testing.T) string {
	t.Helper()
	yaml := "postgres:\n  dsn: postgres://app@127.0.0.1:1/app\nkafka:\n  brokers: [\"127.0.0.1:1\"]\n" +
		"dlq:\n  mode: quarantine\ncontracts:\n  registry:\n    url: " + registry.URL() + "\n"
	p := filepath.Join(t.TempDir(), "outbox-cdc.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// registerCLI runs outbox-cdc contracts register --json on dir and returns
// the exit code and the report.
func registerCLI(t *testing.T, cfg, dir string, extra ...string) (int, cli.RegisterReport) {
	t.Helper()
	ctx := testCtx(t, time.Minute)
	var out, errs bytes.Buffer
	args := append([]string{"contracts", "register", "--config", cfg, "--schemas", dir, "--json"}, extra...)
	code := cli.Run(ctx, args, &out, &errs, nil)
	var rep cli.RegisterReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("exit %d, output %q (%v), stderr %s", code, out.String(), err, errs.String())
	}
	return code, rep
}

func outcomes(rep cli.RegisterReport) map[string]contracts.Registration {
	m := map[string]contracts.Registration{}
	for _, g := range rep.Schemas {
		m[g.Subject] = g
	}
	return m
}

// TestRegisterCLI: contracts register against Apicurio registers new
// subjects of each schema type directly, is idempotent for the same files,
// registers a compatible new version, and refuses an incompatible one
// under BACKWARD with the registry's reason (exit 1), leaving the subject
// as it was; --dry-run registers nothing.
func TestRegisterCLI(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	cfg := cliConfig(t)
	topic := uniqueTopic("cli")
	orders, payments := topic+"-OrderCreated", topic+"-PaymentTaken"
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(orders+".json", orderV1)
	write(payments+".avsc", `{"type":"record","name":"PaymentTaken","fields":[{"name":"id","type":"string"}]}`)
	write("README.md", "not a schema")

	code, rep := registerCLI(t, cfg, dir)
	got := outcomes(rep)
	if code != cli.ExitOK || got[orders].Outcome != contracts.OutcomeRegistered || !got[orders].New ||
		got[payments].Outcome != contracts.OutcomeRegistered || got[payments].Type != "AVRO" || len(rep.Ignored) != 1 {
		t.Fatalf("first register: exit %d, %+v", code, rep)
	}
	ss, err := registryClient(t).SchemaByVersion(ctx, payments, -1)
	if err != nil || ss.Type != sr.TypeAvro || ss.ID != got[payments].ID {
		t.Fatalf("the Avro subject in the registry: %+v, %v; want type AVRO, id %d", ss, err, got[payments].ID)
	}

	code, rep = registerCLI(t, cfg, dir)
	for s, g := range outcomes(rep) {
		if g.Outcome != contracts.OutcomeUnchanged || g.Version != 1 || g.ID != got[s].ID {
			t.Fatalf("second register (idempotent): exit %d, %s: %+v; want unchanged version 1 id %d", code, s, g, got[s].ID)
		}
	}

	for _, r := range registryClient(t).SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatBackward}, orders) {
		if r.Err != nil {
			t.Fatalf("set BACKWARD: %v", r.Err)
		}
	}
	write(orders+".json", orderV2) // a new required field: incompatible under BACKWARD
	for _, dry := range [][]string{{"--dry-run"}, nil} {
		code, rep = registerCLI(t, cfg, dir, dry...)
		g := outcomes(rep)[orders]
		if code != cli.ExitFailure || rep.Failed != 1 || g.Outcome != contracts.OutcomeRefused || len(g.Reasons) == 0 ||
			!strings.Contains(g.Reasons[0], "BACKWARD") || !strings.Contains(g.Reasons[0], "version 1") {
			t.Fatalf("incompatible %v: exit %d, %+v; want exit 1 and the registry's reason", dry, code, g)
		}
		t.Logf("refused as expected: %q", g.Reasons)
	}
	if ss, err := registryClient(t).SchemaByVersion(ctx, orders, -1); err != nil || ss.Version != 1 {
		t.Fatalf("after the refusal: %+v, %v; want version 1 still", ss, err)
	}

	// A compatible change (qty loses its minimum: readers accept more) is
	// a new version; a dry run first registers nothing.
	write(orders+".json", strings.Replace(orderV1, `, "minimum": 1`, "", 1))
	if code, rep = registerCLI(t, cfg, dir, "--dry-run"); code != cli.ExitOK || outcomes(rep)[orders].Outcome != contracts.OutcomeCompatible {
		t.Fatalf("compatible, dry run: exit %d, %+v", code, rep)
	}
	code, rep = registerCLI(t, cfg, dir)
	if g := outcomes(rep)[orders]; code != cli.ExitOK || g.Outcome != contracts.OutcomeRegistered || g.Version != 2 || g.New {
		t.Fatalf("compatible: exit %d, %+v; want version 2", code, g)
	}
}

func registryClient(t *testing.T) *sr.Client {
	t.Helper()
	cl, err := sr.NewClient(sr.URLs(registry.URL()))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
