package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
)

// maxCommandStderr bounds the stderr a failed password command leaves in
// its error: enough for a CLI's message, not a whole trace.
const maxCommandStderr = 512

// PasswordSource returns how every PostgreSQL connection gets its password:
// the content of postgres.password_file, or the output of
// postgres.password_command, got anew at each connection attempt so that
// short-lived tokens (RDS/Aurora IAM, Cloud SQL, Azure Entra) and rotated
// files are never used past their life. nil when neither key is set (the
// DSN's password, or none). Errors name the key, never the password.
func (p Postgres) PasswordSource() func(context.Context) (string, error) {
	switch {
	case p.PasswordCommand != "":
		cmd, timeout := p.PasswordCommand, p.PasswordCommandTimeout
		return func(ctx context.Context) (string, error) { return runPasswordCommand(ctx, cmd, timeout) }
	case p.PasswordFile != "":
		file := p.PasswordFile
		return func(context.Context) (string, error) { return passwordFrom("postgres.password_file", file, "") }
	}
	return nil
}

// runPasswordCommand runs command with sh -c and returns its standard
// output without surrounding white space. A failure carries the exit status
// and the end of its standard error, filtered (kafkaopt.LogText), never its
// output.
func runPasswordCommand(ctx context.Context, command string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	stdout := &capped{max: kafkaopt.MaxSecretSize + 1}
	stderr := &capped{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	ownGroup(cmd)
	// Should a child escape the group and hold the pipes open, stop
	// waiting for them shortly after the kill.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if err != nil {
		msg := kafkaopt.LogText(stderr.String())
		if len(msg) > maxCommandStderr {
			msg = "…" + msg[len(msg)-maxCommandStderr:]
		}
		what := err.Error()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			what = fmt.Sprintf("timed out after %s (postgres.password_command_timeout)", timeout)
		}
		if msg != "" {
			what += ": " + msg
		}
		return "", fmt.Errorf("postgres.password_command: %s", what)
	}
	pw := strings.TrimSpace(stdout.String())
	if pw == "" {
		return "", errors.New("postgres.password_command: printed nothing on standard output")
	}
	if stdout.Len() > kafkaopt.MaxSecretSize {
		return "", fmt.Errorf("postgres.password_command: printed more than %d bytes, not a password", kafkaopt.MaxSecretSize)
	}
	return pw, nil
}

// capped keeps the first max bytes written to it and drops the rest, so a
// runaway command cannot fill the memory.
type capped struct {
	bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.Len(); room > 0 {
		c.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
