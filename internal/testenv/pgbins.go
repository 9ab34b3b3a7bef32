package testenv

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// pgCopies is where server binaries the postgres OS user cannot reach are
// copied to: root-owned, world-searchable, outside any clone.
const pgCopies = "/var/tmp/outbox-cdc-pg"

// reachableBinDir returns binDir when the server's OS user (cred; nil: the
// tests' own user) can run the binaries there. As root the server runs as
// postgres, who cannot traverse a clone under a 0700 directory (root's
// home, mktemp -d): then the installation (binDir's parent: bin, lib,
// share, as scripts/fetch-postgres.sh lays it out) is copied once under
// pgCopies and that copy's bin is returned. A layout it cannot copy is an
// error saying what to change.
func reachableBinDir(binDir string, cred *syscall.Credential) (string, error) {
	if cred == nil || runsAs(binDir, cred) == nil {
		return binDir, nil
	}
	fix := fmt.Sprintf("make every directory above %s searchable by the postgres user (chmod o+x) or set %s to binaries it can run", binDir, EnvPGBinDir)
	if filepath.Base(binDir) != "bin" {
		return "", fmt.Errorf("the postgres OS user cannot run %s: %w; %s", binDir, runsAs(binDir, cred), fix)
	}
	root := filepath.Dir(binDir)
	stamp, err := installStamp(root)
	if err != nil {
		return "", fmt.Errorf("postgres binaries %s: %w", root, err)
	}
	dst := filepath.Join(pgCopies, fmt.Sprintf("%x", sha256.Sum256([]byte(root)))[:16])
	if v, ok := readStamp(dst); !ok || v != stamp {
		if err := copyInstall(root, dst, stamp); err != nil {
			return "", fmt.Errorf("the postgres OS user cannot run %s, and copying it to %s failed: %w; %s", binDir, dst, err, fix)
		}
	}
	bin := filepath.Join(dst, "bin")
	if err := runsAs(bin, cred); err != nil {
		return "", fmt.Errorf("the postgres OS user cannot run %s (a copy of %s) either: %w; %s", bin, binDir, err, fix)
	}
	return bin, nil
}

// runsAs runs dir's postgres --version as cred.
func runsAs(dir string, cred *syscall.Credential) error {
	cmd := exec.Command(filepath.Join(dir, "postgres"), "--version")
	cmd.Dir = "/" // the user may not be able to enter the tests' cwd
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w %s", err, out)
	}
	return nil
}

// installStamp identifies root's contents: the version fetch-postgres.sh
// stamps, else the postgres binary's size and time.
func installStamp(root string) (string, error) {
	if v, ok := readStamp(root); ok {
		return v, nil
	}
	fi, err := os.Stat(filepath.Join(root, "bin", "postgres"))
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(fi.Size(), 10) + "-" + strconv.FormatInt(fi.ModTime().UnixNano(), 10), nil
}

// copyInstall copies root to dst, readable by everyone, stamped last; a
// concurrent copy (go test runs packages in parallel) that got there first
// wins.
func copyInstall(root, dst, stamp string) error {
	if err := os.MkdirAll(pgCopies, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(pgCopies, 0o755); err != nil { // whatever root's umask
		return err
	}
	tmp, err := os.MkdirTemp(pgCopies, filepath.Base(dst)+".tmp.")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		to := filepath.Join(tmp, rel)
		switch {
		case d.IsDir():
			if err := os.MkdirAll(to, 0o755); err != nil {
				return err
			}
			return os.Chmod(to, 0o755)
		case d.Type()&fs.ModeSymlink != 0: // lib's .so links
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		}
		return copyExecutable(path, to)
	})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), []byte(stamp+"\n"), 0o644); err != nil {
		return err
	}
	if v, ok := readStamp(dst); ok && v != stamp {
		_ = os.RemoveAll(dst) // an older copy
	}
	if err := os.Rename(tmp, dst); err != nil {
		if v, ok := readStamp(dst); ok && v == stamp {
			return nil // another process copied it meanwhile
		}
		return err
	}
	return nil
}

// copyExecutable copies a regular file: executables 0755, others 0644.
func copyExecutable(from, to string) error {
	fi, err := os.Stat(from)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return errors.New(from + " is not a regular file")
	}
	mode := os.FileMode(0o644)
	if fi.Mode()&0o111 != 0 {
		mode = 0o755
	}
	if err := copyFile(from, to, mode); err != nil {
		return err
	}
	return os.Chmod(to, mode) // whatever root's umask
}

// copyFile copies from to a new file to, created with mode (less the
// umask).
func copyFile(from, to string, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
