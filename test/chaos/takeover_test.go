package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// takeover is the failover of an active-standby pair (docs/operations.md,
// "Running two connectors"): a second process starts beside the active one
// and waits for the slot; the active one is then killed (SIGKILL) or
// stopped (SIGTERM, as a rolling update does) under load, and the standby
// must take over. In the exactly_once run the standby takes the
// transactional id over once the slot is free, fencing the old producer.
func (r *run) takeover(ctx context.Context, f *faultRecord) (string, error) {
	c := r.conn
	old := c.current()
	b, err := c.launchStandby(ctx)
	if err != nil {
		return "", err
	}
	// Up: /healthz answers while /readyz does not (the slot is busy).
	if err := c.waitOK(ctx, b, "/healthz", time.Minute); err != nil {
		return "", fmt.Errorf("%w\n%s", err, c.logOf(b.N))
	}
	wait := r.between(200*time.Millisecond, 1500*time.Millisecond)
	sleepCtx(ctx, wait) // the standby retries the busy slot meanwhile
	if b.exited() {
		return "", fmt.Errorf("standby #%d exited while the active one streamed: %v\n%s", b.N, b.err, c.logOf(b.N))
	}
	apid, err := c.activePID(ctx)
	if err != nil {
		return "", err
	}
	how := "SIGKILL"
	if r.rng.Float64() < 0.5 {
		how = "SIGTERM"
		err = c.stop(time.Minute)
	} else {
		_, err = c.kill()
		f.Kills++
	}
	if err != nil {
		return "", err
	}
	slot, ckpt, err := c.handoverPosition(ctx, apid)
	if err != nil {
		return "", err
	}
	c.promote(b, old.ExitAt, slot, ckpt)
	f.restarted = b.Start
	if err := c.waitReady(ctx, b, time.Minute); err != nil {
		return "", err
	}
	b.Ready = time.Now()
	return fmt.Sprintf("standby #%d waited %v beside #%d, which got %s; #%d streams after slot %v / checkpoint %v, ready %v after #%d was gone",
		b.N, wait.Round(time.Millisecond), old.N, how, b.N, slot, ckpt, b.Ready.Sub(b.Start).Round(time.Millisecond), old.N), nil
}

// launchStandby starts a process beside the current one, on the spare
// HTTP address; it becomes current only when promoted.
func (c *connector) launchStandby(ctx context.Context) (*incarnation, error) {
	c.mu.Lock()
	if c.cur == nil || c.cur.exited() || c.standby != nil {
		c.mu.Unlock()
		return nil, errors.New("a standby needs exactly one running connector")
	}
	in := &incarnation{N: len(c.incs) + 1, Reason: "after-kill"}
	in.ownLog = fmt.Sprintf("%s.%d", c.logPath, in.N)
	addr := c.spareAddr
	c.mu.Unlock()
	if err := c.exec(in, addr); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.standby = in
	c.mu.Unlock()
	return in, nil
}

// promote makes the standby the current process once the active one is
// gone at gone: its start, for the analysis, is then (it could not stream
// before), and it resumes after the given slot and checkpoint positions.
func (c *connector) promote(in *incarnation, gone time.Time, slot, ckpt lsn.LSN) {
	c.mu.Lock()
	defer c.mu.Unlock()
	in.Start, in.SlotAtStart, in.CkptAtStart = gone, slot, ckpt
	c.cur, c.standby = in, nil
	c.incs = append(c.incs, in)
	c.httpAddr, c.spareAddr = c.spareAddr, c.httpAddr
}

// activePID is the walsender serving the slot now, 0 when none.
func (c *connector) activePID(ctx context.Context) (int32, error) {
	conn, err := pgx.Connect(ctx, direct(c.dsn))
	if err != nil {
		return 0, fmt.Errorf("read slot: %w", err)
	}
	defer conn.Close(context.Background())
	var pid *int32
	if err := conn.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, c.slot).Scan(&pid); err != nil {
		return 0, fmt.Errorf("read slot: %w", err)
	}
	if pid == nil {
		return 0, nil
	}
	return *pid, nil
}

// handoverPosition waits until walsender apid no longer serves the slot
// and returns what the standby resumes after (slotPosition). Unlike
// restartPosition it does not wait for the slot to be free: the standby
// may hold it already.
func (c *connector) handoverPosition(ctx context.Context, apid int32) (slot, ckpt lsn.LSN, err error) {
	return c.slotPosition(ctx, func(pid *int32) bool { return apid == 0 || pid == nil || *pid != apid },
		fmt.Sprintf("still served by walsender %d 30s after the connector was gone", apid))
}
