package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Stop shuts the server down with SIGINT ("fast" shutdown: active
// transactions are rolled back, a checkpoint is written) and waits for it to
// exit. If ctx ends first the process group is killed.
func (pg *Postgres) Stop(ctx context.Context) error {
	if pg.external != "" {
		return ErrExternal
	}
	pg.mu.Lock()
	defer pg.mu.Unlock()
	return pg.stopLocked(ctx, syscall.SIGINT)
}

// ImmediateStop shuts the server down with SIGQUIT ("immediate" shutdown: no
// checkpoint, crash recovery on next start) and waits for it to exit.
func (pg *Postgres) ImmediateStop() error {
	if pg.external != "" {
		return ErrExternal
	}
	pg.mu.Lock()
	defer pg.mu.Unlock()
	ctx, cancel := detachedContext(30 * time.Second)
	defer cancel()
	return pg.stopLocked(ctx, syscall.SIGQUIT)
}

func (pg *Postgres) stopLocked(ctx context.Context, sig syscall.Signal) error {
	if pg.proc == nil {
		return nil
	}
	if err := pg.proc.stop(ctx, sig); err != nil {
		return fmt.Errorf("stop postgres: %w", err)
	}
	return nil
}

// Crash kills the postmaster and all its children with SIGKILL, like a power
// cut for the server processes (the OS page cache survives). The next
// Restart runs crash recovery.
func (pg *Postgres) Crash() error {
	if pg.external != "" {
		return ErrExternal
	}
	pg.mu.Lock()
	defer pg.mu.Unlock()
	p := pg.proc
	if p == nil || p.exited() {
		return ErrNotRunning
	}
	ctx, cancel := detachedContext(30 * time.Second)
	defer cancel()
	if err := p.kill(ctx); err != nil {
		return fmt.Errorf("crash postgres: %w", err)
	}
	if err := waitPortFree(ctx, pg.port); err != nil {
		return fmt.Errorf("crash postgres: %w", err)
	}
	pg.removeStalePidFile()
	return nil
}

// removeStalePidFile deletes postmaster.pid left by a killed server if its
// PID now belongs to an unrelated process; postgres would otherwise refuse to
// start. A PID file naming a dead process is left for postgres to clean up,
// because it also records the old shared memory segment to reclaim.
func (pg *Postgres) removeStalePidFile() {
	path := filepath.Join(pg.dataDir, "postmaster.pid")
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || syscall.Kill(pid, 0) == nil {
		_ = os.Remove(path)
	}
}

// Restart starts the server again on the same data directory and port and
// waits until it accepts connections. A running server is fast-stopped first.
func (pg *Postgres) Restart(ctx context.Context) error {
	if pg.external != "" {
		return ErrExternal
	}
	ctx, cancel := pg.closing.bind(ctx)
	defer cancel()
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if err := pg.stopLocked(ctx, syscall.SIGINT); err != nil {
		return fmt.Errorf("restart postgres: %w", err)
	}
	if err := waitPortFree(ctx, pg.port); err != nil {
		return fmt.Errorf("restart postgres: %w", err)
	}
	if err := pg.start(ctx); err != nil {
		return fmt.Errorf("restart postgres: %w", err)
	}
	return nil
}

// Close stops the server if it is running and removes its directory. It is
// a no-op for an external server.
func (pg *Postgres) Close() error {
	if pg.external != "" {
		return nil
	}
	if pg.closing.cancel != nil {
		pg.closing.cancel()
	}
	pg.mu.Lock()
	defer pg.mu.Unlock()
	ctx, cancel := detachedContext(30 * time.Second)
	defer cancel()
	err := pg.stopLocked(ctx, syscall.SIGINT)
	if pg.baseDir != "" {
		if rerr := os.RemoveAll(pg.baseDir); rerr != nil && err == nil {
			err = rerr
		}
	}
	if err != nil {
		return fmt.Errorf("close postgres: %w", err)
	}
	return nil
}
