package testenv

import (
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestReachableBinDirCopiesOutOfPrivateDir: as root, binaries under a 0700
// directory (a clone in root's home or under mktemp -d) cannot be run by
// the postgres user; reachableBinDir returns a copy that can.
func TestReachableBinDirCopiesOutOfPrivateDir(t *testing.T) {
	u, err := user.Lookup("postgres")
	if os.Geteuid() != 0 || err != nil {
		t.Skip("needs root and a postgres OS user")
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	private := t.TempDir() // 0700
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(private, "clone", ".cache", "postgres", "13", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho 'postgres (PostgreSQL) 13.22'\n"
	if err := os.WriteFile(filepath.Join(bin, "postgres"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(bin), ".complete"), []byte("13.22.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := runsAs(bin, cred); err == nil {
		t.Fatal("the postgres user runs binaries under a 0700 directory: the test proves nothing")
	}
	got, err := reachableBinDir(bin, cred)
	if err != nil {
		t.Fatalf("reachableBinDir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(got)) })
	if !strings.HasPrefix(got, pgCopies+"/") {
		t.Fatalf("reachableBinDir = %s, want a copy under %s", got, pgCopies)
	}
	if err := runsAs(got, cred); err != nil {
		t.Fatalf("the postgres user cannot run the copy %s: %v", got, err)
	}
	if again, err := reachableBinDir(bin, cred); err != nil || again != got {
		t.Fatalf("second call = %s, %v; want the same copy %s", again, err, got)
	}
}
