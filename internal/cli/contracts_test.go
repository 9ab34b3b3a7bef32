package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
)

var (
	ref1      = contracts.SchemaRef{Subject: "t-A", Version: 2, ID: 9}
	violation = &contracts.Violation{Schema: ref1, Pointer: "/qty", Reason: "got string, want integer", More: 1}
	noSubject = &contracts.RegistryError{Subject: "t-B", Kind: contracts.ErrNoSubject}
	badSchema = &contracts.RegistryError{Subject: "t-C", Kind: contracts.ErrBadSchema, Err: errors.New("not JSON")}
)

// TestCheckTally: each type's verdict from its rows' answers.
func TestCheckTally(t *testing.T) {
	type answer struct {
		err error
		id  string
	}
	fits := answer{nil, "e0"}
	for _, tc := range []struct {
		name        string
		unknownType string
		answers     []answer
		tombstones  int
		wantFailed  bool
		wantRows    int
		wantViol    int
		wantProblem string
	}{
		{"all fit", config.ContractsQuarantine, []answer{fits, fits}, 0, false, 2, 0, ""},
		{"a violation", config.ContractsQuarantine, []answer{fits, {violation, "e7"}}, 0, true, 2, 1, ""},
		{"no subject", config.ContractsQuarantine, []answer{{noSubject, "e1"}}, 0, true, 0, 0, "no schema is registered"},
		{"no subject, pass", config.ContractsPass, []answer{{noSubject, "e1"}}, 0, false, 0, 0, "published unchecked"},
		{"bad schema", config.ContractsPass, []answer{{badSchema, "e1"}}, 0, true, 0, 0, "not JSON"},
		{"tombstones only", config.ContractsQuarantine, nil, 2, false, 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tally := newCheckTally(tc.unknownType)
			k := typeKey{"public.outbox", "A", "t"}
			for _, a := range tc.answers {
				res := contracts.Result{Schema: ref1}
				tally.add(k, "t-A", a.id, res, a.err)
			}
			for range tc.tombstones {
				tally.entry(k).Tombstones++
			}
			var rep ContractsCheckReport
			tally.report(&rep)
			if len(rep.Types) != 1 {
				t.Fatalf("%d types", len(rep.Types))
			}
			got := rep.Types[0]
			if got.Failed != tc.wantFailed || got.Rows != tc.wantRows || got.Violations != tc.wantViol ||
				!strings.Contains(got.Problem, tc.wantProblem) || (rep.Failures == 1) != tc.wantFailed {
				t.Fatalf("%+v (failures %d); want failed %v, %d rows, %d violations, problem %q",
					got, rep.Failures, tc.wantFailed, tc.wantRows, tc.wantViol, tc.wantProblem)
			}
			if tc.wantViol > 0 && (len(got.Examples) != 1 || got.Examples[0].ID != "e7" ||
				got.Examples[0].Reason != "at /qty: got string, want integer and 1 more" || got.Version != 2) {
				t.Fatalf("examples %+v version %d", got.Examples, got.Version)
			}
			if tally.settled(k) != (tc.wantProblem != "") {
				t.Fatalf("settled %v with problem %q", tally.settled(k), got.Problem)
			}
		})
	}
}

// writeConfig writes a configuration with contracts against url ("": off).
func writeConfig(t *testing.T, url string) string {
	t.Helper()
	yaml := "postgres:\n  dsn: postgres://app@127.0.0.1:1/app\nkafka:\n  brokers: [\"127.0.0.1:1\"]\n"
	if url != "" {
		yaml += "dlq:\n  mode: quarantine\ncontracts:\n  registry:\n    url: " + url + "\n"
	}
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestContractsUsage: bad flags, a missing subcommand and contracts off are
// usage errors (exit 2).
func TestContractsUsage(t *testing.T) {
	on, off := writeConfig(t, "http://127.0.0.1:1/apis/ccompat/v7"), writeConfig(t, "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"contracts"}, "unknown command"},
		{[]string{"contracts", "nope", "--config", on}, `unknown command "contracts nope"`},
		{[]string{"contracts", "check", "--config", on, "--sample", "0"}, "--sample 0"},
		{[]string{"contracts", "register", "--config", on}, "--schemas is required"},
		{[]string{"contracts", "register", "--config", on, "--schemas", t.TempDir()}, "no <subject>.json"},
		{[]string{"contracts", "register", "--config", on, "--schemas", "/nonexistent"}, "--schemas"},
		{[]string{"contracts", "check", "--config", off}, "contracts are off"},
		{[]string{"contracts", "check", "--config", on, "extra"}, "unexpected argument"},
	} {
		var out, errs bytes.Buffer
		if code := Run(testCtx(t), tc.args, &out, &errs, nil); code != ExitUsage || !strings.Contains(errs.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errs.String(), ExitUsage, tc.want)
		}
	}
}

// TestContractsRegisterCommand against srfake: registered, then unchanged;
// a registry that is down fails (exit 1). Refusals are proven against
// Apicurio (test/contracts/cli_test.go).
func TestContractsRegisterCommand(t *testing.T) {
	fake := srfake.New()
	defer fake.Close()
	dir := t.TempDir()
	schema := `{"type":"object","properties":{"qty":{"type":"integer"}}}`
	if err := os.WriteFile(filepath.Join(dir, "orders-OrderPlaced.json"), []byte(schema), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, fake.URL())
	run := func(want int, wantOut ...string) {
		t.Helper()
		var out, errs bytes.Buffer
		code := Run(testCtx(t), []string{"contracts", "register", "--config", cfg, "--schemas", dir}, &out, &errs, nil)
		if code != want {
			t.Fatalf("exit %d, want %d:\n%s%s", code, want, out.String(), errs.String())
		}
		for _, w := range wantOut {
			if !strings.Contains(out.String(), w) {
				t.Fatalf("output lacks %q:\n%s", w, out.String())
			}
		}
	}
	run(ExitOK, "registered  orders-OrderPlaced (JSON", "version 1", "new subject")
	run(ExitOK, "unchanged   orders-OrderPlaced")
	if ss, err := mustClient(t, fake.URL()).SchemaByVersion(testCtx(t), "orders-OrderPlaced", -1); err != nil || ss.Version != 1 {
		t.Fatalf("registry holds %+v, %v; want one version", ss, err)
	}
	fake.Close()
	run(ExitFailure, "failed      orders-OrderPlaced", "unreachable")
}

func mustClient(t *testing.T, url string) *sr.Client {
	t.Helper()
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
