package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// CopyData copies the data directory of the stopped server aside, as a
// file-level backup does, and returns where. RestoreData puts it back.
func (pg *Postgres) CopyData(ctx context.Context) (string, error) {
	if pg.external != "" {
		return "", ErrExternal
	}
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.proc != nil && !pg.proc.exited() {
		return "", fmt.Errorf("copy data: the server is running; stop it first")
	}
	dst := filepath.Join(pg.baseDir, fmt.Sprintf("backup-%d", os.Getpid()))
	if err := os.RemoveAll(dst); err != nil {
		return "", fmt.Errorf("copy data: %w", err)
	}
	// cp -a keeps the owner (the postgres user) and the modes initdb set.
	if out, err := exec.CommandContext(ctx, "cp", "-a", pg.dataDir, dst).CombinedOutput(); err != nil {
		return "", fmt.Errorf("copy data: %w: %s", err, out)
	}
	return dst, nil
}

// RestoreData replaces the stopped server's data directory with a copy
// CopyData made: the server starts (Restart) as it was when copied, with the
// same system identifier and timeline, and a WAL that ends where the copy's
// did. The copy stays, for another restore.
func (pg *Postgres) RestoreData(ctx context.Context, src string) error {
	if pg.external != "" {
		return ErrExternal
	}
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.proc != nil && !pg.proc.exited() {
		return fmt.Errorf("restore data: the server is running; stop it first")
	}
	if err := os.RemoveAll(pg.dataDir); err != nil {
		return fmt.Errorf("restore data: %w", err)
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", src, pg.dataDir).CombinedOutput(); err != nil {
		return fmt.Errorf("restore data: %w: %s", err, out)
	}
	return nil
}
