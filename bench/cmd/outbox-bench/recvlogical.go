package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// recvLogical drains slot to endpos with pg_recvlogical, the physical limit
// of the WAL path: the walsender decodes with pgoutput exactly as for the
// connector, and the client only writes the bytes to /dev/null. It exits by
// itself at endpos.
func (e *env) recvLogical(ctx context.Context, slot, endpos string, events int, timeout time.Duration) (ReaderRun, error) {
	bin := filepath.Join(e.pg.BinDir(), "pg_recvlogical")
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=%s", e.pg.Port(), database)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin,
		"-d", conninfo, "--slot", slot, "--start", "--no-loop",
		"--endpos", endpos,
		"-o", "proto_version=1", "-o", "publication_names="+publication,
		"-f", "/dev/null")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	probe := cpuProbe{pgPID: e.pgPID, kafkaPID: e.kafkaPID}
	a := probe.snap()
	out, err := cmd.CombinedOutput()
	elapsed := time.Since(a.at)
	if err != nil {
		return ReaderRun{}, fmt.Errorf("pg_recvlogical: %w\n%s", err, out)
	}
	// The walsender exits after its client: wait until it has released the
	// slot and been reaped, or its CPU time would be missed.
	if err := e.waitSlotInactive(ctx, slot); err != nil {
		return ReaderRun{}, err
	}
	waitReaped(e.pgPID, 5*time.Second)
	b := probe.snap()
	cpu := usage(a, b)
	if ps := cmd.ProcessState; ps != nil {
		cpu.Client = (ps.UserTime() + ps.SystemTime()).Seconds()
		cpu.Other = max(0, cpu.Other-cpu.Client)
	}
	return newReaderRun(elapsed, events, cpu), nil
}

// ReaderRun is one reader draining a backlog.
type ReaderRun struct {
	Seconds      float64  `json:"seconds"`
	EventsPerSec float64  `json:"events_per_sec"`
	CPU          CPUUsage `json:"cpu"`
}

func newReaderRun(d time.Duration, events int, cpu CPUUsage) ReaderRun {
	return ReaderRun{Seconds: d.Seconds(), EventsPerSec: float64(events) / d.Seconds(), CPU: cpu}
}
