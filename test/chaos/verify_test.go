package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/cli"
)

// verifyJSON is what the run's verify found: outbox-cdc verify over the
// whole run (the command the lost-slot runbook prints), after the last
// connector stopped.
type verifyJSON struct {
	Exit    int     `json:"exit"`
	Rows    int64   `json:"rows"`
	Found   int64   `json:"found"`
	Missing int64   `json:"missing"`
	Seconds float64 `json:"seconds"`
	Error   string  `json:"error,omitempty"`
}

// verifyRun runs `outbox-cdc verify --json` over the rows written since
// since, with the connector's configuration; it must finish and find
// every row in Kafka.
func (r *run) verifyRun(ctx context.Context, since time.Time, fail func(string, ...any)) *verifyJSON {
	vctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	began := time.Now()
	cmd := exec.CommandContext(vctx, r.conn.bin, "verify", "--json", "--config", r.conn.cfgPath,
		"--since", since.Add(-time.Second).UTC().Format(time.RFC3339Nano))
	cmd.Env = cleanEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	v := &verifyJSON{Seconds: round2(time.Since(began).Seconds())}
	var ee *exec.ExitError
	switch {
	case vctx.Err() != nil:
		v.Exit, v.Error = -1, "verify did not finish within 4m"
	case errors.As(err, &ee):
		v.Exit = ee.ExitCode()
	case err != nil:
		v.Exit, v.Error = -1, err.Error()
	}
	var rep cli.VerifyReport
	if v.Error == "" {
		if jerr := json.Unmarshal(out, &rep); jerr != nil {
			v.Error = "verify --json printed no report: " + jerr.Error()
		}
	}
	v.Rows, v.Found, v.Missing = rep.Rows, rep.Found, rep.Missing.Count
	if v.Error != "" || v.Exit != 0 || v.Missing != 0 || v.Rows == 0 {
		tail := stderr.String()
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		fail("verify over the run: exit %d, %d rows, %d found, %d missing, %s\n%s", v.Exit, v.Rows, v.Found, v.Missing, v.Error, tail)
	}
	return v
}
