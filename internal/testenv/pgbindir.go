package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// FindPostgresBinDir locates the PostgreSQL server binaries: $OUTBOX_CDC_PG_BINDIR,
// then pg_config --bindir, then initdb on PATH, then the newest
// /usr/lib/postgresql/*/bin (Debian keeps server binaries off PATH).
func FindPostgresBinDir() (string, error) {
	if dir := os.Getenv(EnvPGBinDir); dir != "" {
		if !hasPGServer(dir) {
			return "", fmt.Errorf("%s=%s has no initdb and postgres", EnvPGBinDir, dir)
		}
		return dir, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); hasPGServer(dir) {
			return dir, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if dir := filepath.Dir(p); hasPGServer(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first; the glob sorts "9.6" after "15".
	slices.SortFunc(dirs, func(a, b string) int {
		return pgDirVersion(b) - pgDirVersion(a)
	})
	for _, dir := range dirs {
		if hasPGServer(dir) {
			return dir, nil
		}
	}
	return "", errors.New("PostgreSQL server binaries (initdb, postgres) not found: " + pgInstallHint)
}

func hasPGServer(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() {
			return false
		}
	}
	return true
}

// binMajor is the major version of the postgres binary in dir, from
// "postgres (PostgreSQL) 13.22"; 0 if it cannot tell.
func binMajor(dir string) int {
	out, err := exec.Command(filepath.Join(dir, "postgres"), "--version").Output()
	if err != nil {
		return 0
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return 0
	}
	major, _, _ := strings.Cut(f[len(f)-1], ".")
	n, _ := strconv.Atoi(major)
	return n
}

// pgDirVersion turns /usr/lib/postgresql/15/bin into 1500 and .../9.6/bin into 906.
func pgDirVersion(dir string) int {
	v := filepath.Base(filepath.Dir(dir))
	major, minor, _ := strings.Cut(v, ".")
	ma, _ := strconv.Atoi(major)
	mi, _ := strconv.Atoi(minor)
	return ma*100 + mi
}
