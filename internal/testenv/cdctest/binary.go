package cdctest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// EnvBin names a connector binary built already (make integration and make
// chaos build one); without it the suites build their own with Build.
const EnvBin = "OUTBOX_CDC_BIN"

// Build compiles ./cmd/outbox-cdc into out with goCmd ("go", or the
// benchmark's -go), from the repository root; flags go before -o.
func Build(ctx context.Context, goCmd, out string, flags ...string) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	args := append(append([]string{"build"}, flags...), "-o", out, "./cmd/outbox-cdc")
	cmd := exec.CommandContext(ctx, goCmd, args...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/outbox-cdc: %w\n%s", err, b)
	}
	return nil
}

// Run runs bin with args (Command's environment plus env) to completion and
// returns its exit code and combined output; err is only for a process that
// could not run or was stopped by ctx.
func Run(ctx context.Context, bin string, env []string, args ...string) (code int, out string, err error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(CleanEnv(), env...)
	b, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ctx.Err() == nil {
		return ee.ExitCode(), string(b), nil
	}
	if err != nil {
		return -1, string(b), fmt.Errorf("run %s %v: %w", bin, args, errors.Join(err, ctx.Err()))
	}
	return 0, string(b), nil
}
