package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
)

// contractsCommands are the subcommands of outbox-cdc contracts, for CI
// pipelines before a deploy (docs/contracts.md).
var contractsCommands = map[string]func() command{
	"check":    func() command { return &contractsCheckCmd{} },
	"register": func() command { return &contractsRegisterCmd{} },
}

// contractsTimeout bounds a whole contracts command: each registry request
// has its own timeout (5 s), and a CI step must end.
const contractsTimeout = 10 * time.Minute

// contractsOff is the usage error of a contracts command run on a
// configuration without contracts.
func contractsOff(e env, name string) bool {
	if e.cfg.Contracts.Enabled() {
		return false
	}
	fmt.Fprintf(e.stderr, "outbox-cdc contracts %s: contracts are off in this configuration: set contracts.registry.url (%s)\n",
		name, "OUTBOX_CDC_CONTRACTS_REGISTRY_URL")
	return true
}

// newContracts builds the contracts client of contracts.*; mode overrides
// contracts.mode ("" keeps it).
func newContracts(c config.Contracts, mode contracts.Mode) (*contracts.Contracts, error) {
	reg, err := c.Registry.Registry()
	if err != nil {
		return nil, err
	}
	if mode == "" {
		mode = contracts.Mode(c.Mode)
	}
	return contracts.New(contracts.Config{Registry: reg, Format: contracts.Format(c.Format), Mode: mode,
		Strategy: contracts.Strategy(c.SubjectStrategy), Resolution: contracts.Resolution(c.Resolution)})
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// contractsRegisterCmd is outbox-cdc contracts register.
type contractsRegisterCmd struct {
	schemas      string
	dryRun, json bool
}

func (o *contractsRegisterCmd) register(fs *flag.FlagSet) {
	fs.StringVar(&o.schemas, "schemas", "", "directory of <subject>.json (JSON Schema), .avsc (Avro) and .proto (Protobuf) files (required)")
	fs.BoolVar(&o.dryRun, "dry-run", false, "only check each schema's compatibility; register nothing")
	fs.BoolVar(&o.json, "json", false, "print JSON")
}

func (o *contractsRegisterCmd) problem() string {
	if o.schemas == "" {
		return "--schemas is required (a directory of <subject>.json|.avsc|.proto files)"
	}
	return ""
}

// RegisterReport is what `outbox-cdc contracts register --json` prints.
type RegisterReport struct {
	Registry string                   `json:"registry"`
	DryRun   bool                     `json:"dry_run,omitempty"`
	Schemas  []contracts.Registration `json:"schemas"`
	Ignored  []string                 `json:"ignored,omitempty"` // files without a schema extension
	Failed   int                      `json:"failed"`
}

func (o *contractsRegisterCmd) run(ctx context.Context, e env) int {
	if contractsOff(e, "register") {
		return ExitUsage
	}
	files, ignored, err := contracts.ReadSchemaDir(o.schemas)
	if err == nil && len(files) == 0 {
		err = fmt.Errorf("no <subject>.json, .avsc or .proto file in %s", o.schemas)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "outbox-cdc contracts register: --schemas: %v\n", err)
		return ExitUsage
	}
	ct, err := newContracts(e.cfg.Contracts, "")
	if err != nil {
		fmt.Fprintf(e.stderr, "outbox-cdc contracts register: %v\n", err)
		return ExitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, contractsTimeout)
	defer cancel()
	rep := RegisterReport{Registry: e.cfg.Contracts.Registry.URL, DryRun: o.dryRun, Ignored: ignored}
	for _, f := range files {
		g := ct.Registry().RegisterFile(ctx, f, o.dryRun)
		if g.Failed() {
			rep.Failed++
		}
		rep.Schemas = append(rep.Schemas, g)
	}
	if o.json {
		printJSON(e.stdout, rep)
	} else {
		printRegister(e.stdout, &rep)
	}
	if rep.Failed > 0 {
		return ExitFailure
	}
	return ExitOK
}

func printRegister(w io.Writer, r *RegisterReport) {
	for _, g := range r.Schemas {
		fmt.Fprintf(w, "%-11s %s (%s, %s)", g.Outcome, g.Subject, g.Type, g.File)
		if g.Version > 0 {
			fmt.Fprintf(w, " version %d id %d", g.Version, g.ID)
		}
		if g.New {
			fmt.Fprint(w, " new subject")
		}
		fmt.Fprintln(w)
		for _, m := range g.Reasons {
			fmt.Fprintf(w, "            %s\n", strings.ReplaceAll(m, "\n", "\n            "))
		}
	}
	if len(r.Ignored) > 0 {
		fmt.Fprintf(w, "ignored     %s (not .json, .avsc or .proto)\n", strings.Join(r.Ignored, ", "))
	}
	what := "registered or already there"
	if r.DryRun {
		what = "compatible or already there (dry run: nothing registered)"
	}
	fmt.Fprintf(w, "%d of %d schemas %s; registry %s\n", len(r.Schemas)-r.Failed, len(r.Schemas), what, r.Registry)
}
