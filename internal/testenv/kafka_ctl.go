package testenv

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"
)

// Stop sends SIGTERM, which makes the broker shut down in a controlled way
// (flushing logs and writing checkpoints), and waits for it to exit. If ctx
// ends first the process is killed.
func (k *Kafka) Stop(ctx context.Context) error {
	if k.external != nil {
		return ErrExternal
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.stopLocked(ctx); err != nil {
		return fmt.Errorf("stop kafka: %w", err)
	}
	return nil
}

func (k *Kafka) stopLocked(ctx context.Context) error {
	if k.proc == nil {
		return nil
	}
	return k.proc.stop(ctx, syscall.SIGTERM)
}

// Kill sends SIGKILL to the broker's process group and waits for it to exit:
// no controlled shutdown, the next start recovers the logs.
func (k *Kafka) Kill() error {
	if k.external != nil {
		return ErrExternal
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.proc
	if p == nil || p.exited() {
		return ErrNotRunning
	}
	ctx, cancel := detachedContext(30 * time.Second)
	defer cancel()
	if err := p.kill(ctx); err != nil {
		return fmt.Errorf("kill kafka: %w", err)
	}
	return nil
}

// Restart starts the broker again with the same ports and log directory (no
// re-format) and waits until it is ready. A running broker is stopped first.
func (k *Kafka) Restart(ctx context.Context) error {
	if k.external != nil {
		return ErrExternal
	}
	ctx, cancel := k.closing.bind(ctx)
	defer cancel()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.stopLocked(ctx); err != nil {
		return fmt.Errorf("restart kafka: %w", err)
	}
	ports := []int{k.port, k.ctrlPort}
	if k.security != nil {
		ports = append(ports, k.securePort)
	}
	for _, port := range ports {
		if err := waitPortFree(ctx, port); err != nil {
			return fmt.Errorf("restart kafka: %w", err)
		}
	}
	if err := k.start(ctx); err != nil {
		return fmt.Errorf("restart kafka: %w", err)
	}
	return nil
}

// Close stops the broker if it is running and removes its directory. It is a
// no-op for external brokers.
func (k *Kafka) Close() error {
	if k.external != nil {
		return nil
	}
	if k.closing.cancel != nil {
		k.closing.cancel()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	ctx, cancel := detachedContext(60 * time.Second)
	defer cancel()
	err := k.stopLocked(ctx)
	if k.baseDir != "" {
		if rerr := os.RemoveAll(k.baseDir); rerr != nil && err == nil {
			err = rerr
		}
	}
	if err != nil {
		return fmt.Errorf("close kafka: %w", err)
	}
	return nil
}
