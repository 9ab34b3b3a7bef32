package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/internal/cli"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestContractsCLI: outbox-cdc contracts check (the binary) against a real
// Apicurio and an outbox table: it validates only the last --sample rows
// of each type, names the violating event, and fails a type without a
// subject; exit 0 when clean, 1 with failures.
func TestContractsCLI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	reg, err := testenv.StartRegistry(ctx)
	if err != nil {
		t.Fatalf("start registry: %v", err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfgPath := writeConfig(t, yamlFor(t, dsn, "ctcli", "dlq: {mode: quarantine}\ncontracts: {registry: {url: "+reg.URL()+"}}\n"))
	topic := strings.Replace(topicTemplate, "{aggregate_type}", "order", 1)
	admin, err := contracts.New(contracts.Config{Registry: contracts.RegistryConfig{URL: reg.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	ref, err := admin.Registry().Register(rctx, topic+"-OrderPlaced", orderSchema)
	if err != nil {
		t.Fatalf("register: %v", err)
	}

	conn := pgConnect(t, dsn)
	var badID string
	// One transaction per row: created_at orders them.
	for i, p := range []string{`{"seq": 1, "qty": "one"}`, `{"seq": 2, "qty": 2}`, `{"seq": 3, "qty": 3}`} {
		committed(t, conn, func(tx pgx.Tx) {
			id := insert(t, tx, "outbox", "order", "o-1", "OrderPlaced", p)
			if i == 0 {
				badID = id
			}
		})
	}
	check := func(want int, sample string) cli.ContractsCheckReport {
		t.Helper()
		code, out := runBinary(t, 2*time.Minute, nil, "contracts", "check", "--config", cfgPath, "--sample", sample, "--json")
		var rep cli.ContractsCheckReport
		if i := strings.Index(out, "{"); i < 0 || json.Unmarshal([]byte(out[i:]), &rep) != nil || code != want {
			t.Fatalf("contracts check --sample %s: exit %d, want %d:\n%s", sample, code, want, out)
		}
		return rep
	}
	rep := check(cli.ExitOK, "2") // the violating row is older than the last 2
	if len(rep.Types) != 1 || rep.Types[0].Rows != 2 || !rep.Types[0].Registered || rep.Types[0].Version != ref.Version ||
		rep.Types[0].Topic != topic {
		t.Fatalf("--sample 2: %+v; want OrderPlaced on %s, 2 rows checked under version %d", rep.Types, topic, ref.Version)
	}
	rep = check(cli.ExitFailure, "3")
	if tc := rep.Types[0]; tc.Violations != 1 || len(tc.Examples) != 1 || tc.Examples[0].ID != badID ||
		!strings.Contains(tc.Examples[0].Reason, "/qty") || rep.Failures != 1 {
		t.Fatalf("--sample 3: %+v; want event %s's violation at /qty", tc, badID)
	}

	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "order", "o-2", "OrderLost", `{"seq": 4, "qty": 4}`) })
	code, out := runBinary(t, 2*time.Minute, nil, "contracts", "check", "--config", cfgPath, "--sample", "2")
	if code != cli.ExitFailure || !strings.Contains(out, "FAIL public.outbox OrderLost") ||
		!strings.Contains(out, "subject "+topic+"-OrderLost: not registered") || !strings.Contains(out, "1 failing") {
		t.Fatalf("unknown type: exit %d:\n%s", code, out)
	}
	t.Logf("contracts check:\n%s", out)
}
