package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUpgradeBinDir: a missing or incomplete installation is an error
// naming the missing tools and the make target that fetches them; one of
// another major is refused.
func TestUpgradeBinDir(t *testing.T) {
	fake := func(t *testing.T, version string, tools []string) string {
		base := t.TempDir()
		bin := filepath.Join(base, "17", "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, tool := range tools {
			script := "#!/bin/sh\necho '" + tool + " (PostgreSQL) " + version + "'\n"
			if err := os.WriteFile(filepath.Join(bin, tool), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return base
	}
	tests := []struct {
		name    string
		version string
		tools   []string
		want    []string // substrings of the error; none: no error
	}{
		{"complete", "17.11", upgradeTools, nil},
		{"empty", "17.11", nil, []string{"lacks initdb", "pg_upgrade", "make pg-upgrade-binaries", EnvPGFullDir}},
		{"server binaries only", "17.6", []string{"initdb", "postgres", "pg_ctl"}, []string{"lacks pg_controldata, pg_upgrade"}},
		{"another major", "18.0", upgradeTools, []string{"is PostgreSQL 18, want 17"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := fake(t, tt.version, tt.tools)
			t.Setenv(EnvPGFullDir, base)
			dir, err := UpgradeBinDir(17)
			if tt.want == nil {
				if err != nil || dir != filepath.Join(base, "17", "bin") {
					t.Fatalf("UpgradeBinDir = %q, %v", dir, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("UpgradeBinDir = %q, want an error", dir)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
