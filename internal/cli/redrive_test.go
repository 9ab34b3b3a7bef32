package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestRedriveUsage: the flag combinations redrive refuses, before it
// loads the configuration.
func TestRedriveUsage(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "either --list or --aggregate"},
		{[]string{"--list", "--aggregate", "a"}, "either --list or --aggregate"},
		{[]string{"--skip", "--list"}, "--skip needs --aggregate"},
		{[]string{"--aggregate", "a", "--json"}, "--json goes with --list"},
		{[]string{"--aggregate", "a", "--wait", "0s"}, "--wait must be positive"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		code := Run(t.Context(), append([]string{"redrive", "--config", "/nonexistent.yaml"}, tt.args...), &stdout, &stderr, nil)
		if code != ExitUsage || !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("redrive %v: exit %d, stderr %q; want %d with %q", tt.args, code, stderr.String(), ExitUsage, tt.want)
		}
	}
	ok := redriveOpts{aggregate: "a", wait: time.Minute}
	if p := ok.problem(); p != "" {
		t.Errorf("--aggregate a: %q", p)
	}
}
