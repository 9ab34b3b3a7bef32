package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The operations fault class: what an operator does to a running outbox.
// Some of these must stop the connector (exit 1, a message that names the
// problem); the suite then applies the fix and starts it again, and the
// verdict is unchanged: nothing lost, order kept, nothing confirmed early.

const (
	// bigTopicMaxBytes is max.message.bytes of the "big" aggregate type's
	// topic; oversizePad makes each of its events larger than that.
	bigTopicMaxBytes = 1024
	oversizePad      = 4096

	// opsExitTimeout bounds the wait for a connector that must stop.
	opsExitTimeout = 30 * time.Second

	// The checkpoint the connector keeps (checkpoint.store table, the
	// default) and the column ops-foreign-checkpoint rewrites. The checkpoint
	// also carries timeline, database and slot.
	ckptTable       = "outbox_cdc.checkpoints"
	ckptSystemIDCol = "system_id"
)

// What the log must say when the connector stops.
var (
	wantDroppedColumn   = regexp.MustCompile(`\bevent_type\b`)
	droppedMappedColumn = "event_type"
)

// wantForeignSystem: the refusal of a checkpoint from another cluster must
// be about the system identifier: it says so ("system identifier",
// "system_id", "system id") or names the planted identifier beside the word
// "system".
func wantForeignSystem(foreign string) *regexp.Regexp {
	f := regexp.QuoteMeta(foreign)
	return regexp.MustCompile(`(?i)system[ _]?id|\bsystem\b.*\b` + f + `\b|\b` + f + `\b.*\bsystem\b`)
}

// outboxDDL creates the outbox, with the index on created_at that
// retention needs. Partitioned, its root is RANGE-partitioned on
// created_at (as retention asks of a partitioned outbox) with a single
// partition for all time, bucketParent, RANGE-partitioned on the synthetic
// bucket column (its primary key includes it; retention_test.go says why
// two levels): bucket 1, a default partition (empty; it would take any
// row the others do not), and an empty scratch partition that the first
// ops-partition detaches and drops. Writers name the bucket, so a retried
// transaction hits the primary key whatever the current bucket is by then.
func outboxDDL(partitioned bool) string {
	cols := `
		bucket         integer     NOT NULL DEFAULT 1,
		aggregate_type text        NOT NULL,
		aggregate_id   text        NOT NULL,
		event_type     text        NOT NULL,
		payload        jsonb,
		created_at     timestamptz NOT NULL DEFAULT now()`
	if !partitioned {
		return `CREATE TABLE outbox (
		id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),` + cols + `);
	CREATE INDEX ON outbox (created_at)`
	}
	return `CREATE TABLE outbox (
		id             uuid        NOT NULL DEFAULT gen_random_uuid(),` + cols + `) PARTITION BY RANGE (created_at);
	CREATE INDEX ON outbox (created_at);
	CREATE TABLE ` + bucketParent + ` PARTITION OF outbox (PRIMARY KEY (id, bucket))
		FOR VALUES FROM (MINVALUE) TO (MAXVALUE) PARTITION BY RANGE (bucket);
	CREATE TABLE outbox_default PARTITION OF ` + bucketParent + ` DEFAULT;
	CREATE TABLE outbox_b1 PARTITION OF ` + bucketParent + ` FOR VALUES FROM (1) TO (2);
	CREATE TABLE outbox_scratch_1 PARTITION OF ` + bucketParent + ` FOR VALUES FROM (-1) TO (0);`
}

// bucketParent is the partitioned outbox's partition for all time, whose
// partitions by bucket ops-partition makes and drops.
const bucketParent = "outbox_all"

// skippedKinds reads OUTBOX_CDC_CHAOS_SKIP.
func skippedKinds(t *testing.T) map[string]bool {
	skip := map[string]bool{}
	v := strings.TrimSpace(os.Getenv(EnvSkip))
	if v == "" {
		return skip
	}
	for k := range strings.SplitSeq(v, ",") {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		if k == "ops" {
			for _, f := range allFaults {
				if faultClass(f) == "operations" {
					skip[f] = true
				}
			}
			continue
		}
		found := false
		for _, f := range allFaults {
			found = found || f == k
		}
		if !found {
			t.Fatalf("%s: unknown fault kind %q (kinds: %s, or ops)", EnvSkip, k, strings.Join(allFaults, ", "))
		}
		skip[k] = true
	}
	keys := make([]string, 0, len(skip))
	for _, f := range allFaults {
		if skip[f] {
			keys = append(keys, f)
		}
	}
	t.Logf("chaos: %s: these fault kinds are NOT injected in this run: %s", EnvSkip, strings.Join(keys, ", "))
	return skip
}

// opsFailed records a failed expectation of an operations fault; the run
// goes on (the fix is applied anyway) and fails at the end.
func (r *run) opsFailed(kind, format string, args ...any) {
	msg := kind + ": " + fmt.Sprintf(format, args...)
	r.opsFailures = append(r.opsFailures, msg)
	r.t.Errorf("%s\nconnector log:\n%s", msg, r.conn.logTail(40))
}

// ddl runs statements one by one on a direct connection. A statement that
// times out waiting for its lock (lock_timeout; writers hold row locks
// for milliseconds) is retried; the whole call ends within a minute.
func (r *run) ddl(ctx context.Context, stmts ...string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var conn *pgx.Conn
	for {
		var err error
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err = pgx.Connect(cctx, direct(r.dsn))
		ccancel()
		if err == nil {
			break
		}
		if !sleepCtx(ctx, 100*time.Millisecond) { // retry interval while PostgreSQL may be down
			return fmt.Errorf("connect: %w", err)
		}
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SET lock_timeout = '3s'"); err != nil {
		return err
	}
	for _, q := range stmts {
		for {
			_, err := conn.Exec(ctx, q)
			if err == nil {
				break
			}
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" && ctx.Err() == nil {
				continue
			}
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// query runs one query on a direct connection.
func (r *run) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, direct(r.dsn))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, q, args...).Scan(dest...)
}

// opsPartition attaches a new partition for the next bucket (CREATE TABLE
// ... PARTITION OF, or CREATE TABLE + ATTACH PARTITION), moves the writers
// to it, and detaches and drops the empty scratch partition (attaching the
// next scratch). Events keep flowing; rows of the new partition are
// published.
func (r *run) opsPartition(ctx context.Context) (string, error) {
	if !r.partitioned {
		return "", errors.New("ops-partition on an unpartitioned outbox")
	}
	n := r.bucket.Load() + 1
	name := fmt.Sprintf("outbox_b%d", n)
	var how string
	var err error
	if r.rng.IntN(2) == 0 {
		how = "CREATE TABLE ... PARTITION OF"
		err = r.ddl(ctx, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (%d) TO (%d)", name, bucketParent, n, n+1))
	} else {
		how = "CREATE TABLE + ATTACH PARTITION"
		err = r.ddl(ctx,
			fmt.Sprintf("CREATE TABLE %s (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS)", name),
			fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%d) TO (%d)", bucketParent, name, n, n+1))
	}
	if err != nil {
		return "", err
	}
	mark := r.ledger.len()
	r.bucket.Store(n)
	switched := time.Now()

	old := fmt.Sprintf("outbox_scratch_%d", r.scratch)
	var rows int
	if err := r.queryRow(ctx, "SELECT count(*) FROM "+old, nil, &rows); err != nil {
		return "", err
	}
	if rows != 0 {
		return "", fmt.Errorf("scratch partition %s has %d rows", old, rows)
	}
	next := r.scratch + 1
	if err := r.ddl(ctx,
		"ALTER TABLE "+bucketParent+" DETACH PARTITION "+old,
		"DROP TABLE "+old,
		fmt.Sprintf("CREATE TABLE outbox_scratch_%d PARTITION OF %s FOR VALUES FROM (%d) TO (%d)", next, bucketParent, -next, -next+1)); err != nil {
		return "", err
	}
	r.scratch = next

	// Note when the first row of the new partition was consumed (the
	// catch-up checks decide whether its rows arrive).
	seen := "no row of it consumed within 5s"
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		var first *event
		for _, e := range r.ledger.since(mark) {
			if e.Bucket == int(n) && !e.Message {
				first = &e
				break
			}
		}
		if first != nil {
			select {
			case <-r.live.watch(first.ID):
				at, _ := r.live.seenAt(first.ID)
				seen = fmt.Sprintf("its first row consumed %v after the switch", at.Sub(switched).Round(time.Millisecond))
			case <-time.After(time.Until(deadline)): // the 5 s bound of this observation, reported
			case <-ctx.Done():
				return "", ctx.Err()
			}
			break
		}
		if !sleepCtx(ctx, 10*time.Millisecond) { // poll interval of the ledger
			return "", ctx.Err()
		}
	}
	return fmt.Sprintf("%s %s (bucket %d), writers moved to it, %s; detached and dropped empty %s", how, name, n, seen, old), nil
}

// opsAddColumn adds an unmapped column, waits with the writers running and
// drops it again. The connector must carry on.
func (r *run) opsAddColumn(ctx context.Context) (string, error) {
	col := fmt.Sprintf("chaos_extra_%d", r.opsN)
	types := []string{"text", "jsonb", "integer NOT NULL DEFAULT 7", "text DEFAULT 'extra'"}
	typ := types[r.rng.IntN(len(types))]
	if err := r.ddl(ctx, fmt.Sprintf("ALTER TABLE outbox ADD COLUMN %s %s", col, typ)); err != nil {
		return "", err
	}
	d := r.between(500*time.Millisecond, 3*time.Second)
	sleepCtx(ctx, d) // how long the extra column exists, with the writers running
	if err := r.ddl(ctx, "ALTER TABLE outbox DROP COLUMN "+col); err != nil {
		return "", err
	}
	return fmt.Sprintf("ADD COLUMN %s %s, DROP COLUMN %v later", col, typ, d), nil
}

// opsDropMapped drops event_type, a mapped column. The writers' inserts
// name it, so they fail and retry until it is back; the connector must stop
// with exit code 1 and name the column. Then the column is added back (same
// type, NOT NULL, no default) and the connector started again.
func (r *run) opsDropMapped(ctx context.Context, f *faultRecord) (string, error) {
	in := r.conn.current()
	refusedBefore := r.wstats.undefinedColumn.Load()
	if err := r.ddl(ctx, "ALTER TABLE outbox DROP COLUMN "+droppedMappedColumn); err != nil {
		return "", err
	}
	dropped := time.Now()
	took, line, exitErr := r.conn.expectExit(ctx, in, dropped, opsExitTimeout, wantDroppedColumn)
	// Keep the column away until the writers have been refused for a while.
	for time.Since(dropped) < time.Second || r.wstats.undefinedColumn.Load() == refusedBefore {
		if time.Since(dropped) > 5*time.Second || !sleepCtx(ctx, 20*time.Millisecond) { // poll of the refusal count; 1 s minimum outage
			break
		}
	}
	if err := r.ddl(ctx,
		fmt.Sprintf("ALTER TABLE outbox ADD COLUMN %s text NOT NULL DEFAULT 'chaos'", droppedMappedColumn),
		fmt.Sprintf("ALTER TABLE outbox ALTER COLUMN %s DROP DEFAULT", droppedMappedColumn)); err != nil {
		return "", err
	}
	fixed := time.Now()
	refused := r.wstats.undefinedColumn.Load() - refusedBefore
	if refused == 0 {
		r.opsFailed(fOpsDropMapped, "no writer insert was refused in the %v event_type was missing", fixed.Sub(dropped).Round(time.Millisecond))
	}
	// The writers retry until the column is back: they commit again.
	mark := r.ledger.len()
	for r.ledger.len() == mark {
		if time.Since(fixed) > 10*time.Second {
			r.opsFailed(fOpsDropMapped, "no writer committed within 10s of event_type being added back")
			break
		}
		if !sleepCtx(ctx, 10*time.Millisecond) { // poll interval of the ledger
			return "", ctx.Err()
		}
	}
	desc := fmt.Sprintf("DROP COLUMN %s; %d writer attempts refused and retried; added back after %v",
		droppedMappedColumn, refused, fixed.Sub(dropped).Round(time.Millisecond))
	return r.afterExpectedExit(ctx, f, fOpsDropMapped, "after-ops-exit", in, took, line, exitErr, desc)
}

// afterExpectedExit records how the connector stopped and starts it again
// when it did.
func (r *run) afterExpectedExit(ctx context.Context, f *faultRecord, kind, reason string, in *incarnation, took time.Duration, line string, exitErr error, desc string) (string, error) {
	if exitErr != nil {
		r.opsFailed(kind, "%v", exitErr)
		desc += "; " + exitErr.Error()
	} else {
		f.ExpectedExit = fmt.Sprintf("#%d exit 1 after %v: %s", in.N, took.Round(time.Millisecond), strings.TrimSpace(line))
		r.expectedExits = append(r.expectedExits, kind+": "+f.ExpectedExit)
		desc += fmt.Sprintf("; connector #%d exited 1 after %v", in.N, took.Round(time.Millisecond))
	}
	if !in.exited() {
		return desc + "; connector still running", nil
	}
	next, err := r.conn.start(ctx, reason)
	if next != nil {
		f.restarted = next.Start
	}
	if err != nil {
		return desc, fmt.Errorf("restart after the fix: %w", err)
	}
	return desc + fmt.Sprintf("; #%d ready in %v", next.N, next.Ready.Sub(next.Start).Round(time.Millisecond)), nil
}

// opsPublicationGap removes the outbox from the publication and, after a
// pause with the writers running, adds it back. Inserts of the gap are never
// decoded; the connector must notice, stop before confirming past the gap
// (exit 1, naming the publication), and after the restart publish the rows
// of the gap from the table. The re-add may come before or after the exit.
// ops-publication-gap-messages commits mixed transactions (rows and
// table-less events, messages_test.go) during the gap and waits for all of
// them after the restart.
func (r *run) opsPublicationGap(ctx context.Context, f *faultRecord, kind string) (string, error) {
	in := r.conn.current()
	pub := pgx.Identifier{r.pub}.Sanitize()
	if err := r.ddl(ctx, fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE public.outbox", pub)); err != nil {
		return "", err
	}
	removed := time.Now()
	pause := r.between(300*time.Millisecond, 2500*time.Millisecond)
	type readd struct {
		at    time.Time
		err   error
		mixed []event // ops-publication-gap-messages: committed in the gap
	}
	readded := make(chan readd, 1)
	rctx, cancel := context.WithTimeout(ctx, pause+time.Minute)
	defer cancel()
	go func() {
		var mixed []event
		if kind == fOpsPubGapMsg {
			var err error
			if mixed, err = r.mixDuring(rctx, pause); err != nil {
				readded <- readd{err: fmt.Errorf("mixed transactions in the gap: %w", err)}
				return
			}
		} else if !sleepCtx(rctx, pause) { // how long the outbox stays out of the publication
			readded <- readd{err: rctx.Err()}
			return
		}
		err := r.addToPublication(rctx)
		readded <- readd{time.Now(), err, mixed}
	}()
	want := regexp.MustCompile(regexp.QuoteMeta(r.pub))
	took, line, exitErr := r.conn.expectExit(ctx, in, removed, opsExitTimeout, want)
	var ra readd
	select {
	case ra = <-readded:
	case <-time.After(pause + 2*time.Minute): // deadline
		return "", errors.New("re-adding the outbox to the publication did not return")
	}
	if ra.err != nil {
		return "", fmt.Errorf("re-add the outbox to the publication: %w", ra.err)
	}
	order := "re-added before the exit"
	if exitErr == nil && in.ExitAt.Before(ra.at) {
		order = "re-added after the exit"
	}
	desc := fmt.Sprintf("ALTER PUBLICATION DROP TABLE, ADD TABLE %v later (%s)", ra.at.Sub(removed).Round(time.Millisecond), order)
	desc, err := r.afterExpectedExit(ctx, f, kind, reasonAfterGap, in, took, line, exitErr, desc)
	if err == nil && kind == fOpsPubGapMsg {
		desc += r.awaitMixed(ctx, ra.mixed)
	}
	return desc, err
}

// reasonAfterGap is the reason of a process started after an
// ops-publication-gap: it publishes the gap's rows from the table, and such
// a backfill may send again events confirmed before (at-least-once), which
// checkDuplicates counts apart instead of failing.
const reasonAfterGap = "after-publication-gap"

// addToPublication puts the outbox back; already a member is fine.
func (r *run) addToPublication(ctx context.Context) error {
	err := r.ddl(ctx, fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE public.outbox", pgx.Identifier{r.pub}.Sanitize()))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // duplicate_object: already in it
		return nil
	}
	return err
}

// opsForeignCheckpoint stops the connector, replaces its checkpoint's
// system identifier with another cluster's, and starts it: it must refuse
// (exit 1, the message says the system identifier differs). The suite then
// restores the checkpoint or deletes it and starts the connector again.
func (r *run) opsForeignCheckpoint(ctx context.Context, f *faultRecord) (string, error) {
	if err := r.conn.stop(time.Minute); err != nil {
		r.opsFailed(fOpsForeignCkpt, "clean stop before rewriting the checkpoint: %v", err)
	}
	table := pgx.Identifier(strings.SplitN(ckptTable, ".", 2))
	col := pgx.Identifier{ckptSystemIDCol}.Sanitize()
	var typ string
	err := r.queryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 AND NOT attisdropped`,
		[]any{ckptTable, ckptSystemIDCol}, &typ)
	if errors.Is(err, pgx.ErrNoRows) {
		r.opsFailed(fOpsForeignCkpt, "the checkpoint table %s has no %s column: the connector does not record the cluster it belongs to", ckptTable, ckptSystemIDCol)
		return r.restartAfterStop(ctx, f, "checkpoint has no "+ckptSystemIDCol+"; not injected")
	}
	if err != nil {
		return "", fmt.Errorf("read %s columns: %w", ckptTable, err)
	}
	var orig *string
	if err := r.queryRow(ctx, fmt.Sprintf("SELECT %s::text FROM %s WHERE slot = $1", col, table.Sanitize()), []any{r.conn.slot}, &orig); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			r.opsFailed(fOpsForeignCkpt, "no checkpoint row for slot %s to rewrite", r.conn.slot)
			return r.restartAfterStop(ctx, f, "no checkpoint row; not injected")
		}
		return "", fmt.Errorf("read checkpoint: %w", err)
	}
	var own string
	if err := r.queryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()", nil, &own); err != nil {
		return "", err
	}
	foreign := foreignSystemID(orig, own)
	// A checkpoint of another deployment carries that deployment's history
	// mark, which this server lacks: with this server's own mark the row
	// would be this database carried to a new cluster (pg_upgrade), which
	// the connector accepts (pipeline/moved.go).
	var origMark *int64
	if err := r.queryRow(ctx, fmt.Sprintf("SELECT mark FROM %s WHERE slot = $1", table.Sanitize()), []any{r.conn.slot}, &origMark); err != nil {
		return "", fmt.Errorf("read checkpoint mark: %w", err)
	}
	foreignMark := int64(r.rng.Uint64N(1<<62)) + 1
	setTo := func(v *string, mark *int64) error {
		m := "NULL"
		if mark != nil {
			m = fmt.Sprint(*mark)
		}
		return r.ddl(ctx, fmt.Sprintf("UPDATE %s SET %s = %s, mark = %s WHERE slot = %s", table.Sanitize(), col,
			sqlLiteral(v, typ), m, sqlLiteral(&r.conn.slot, "text")))
	}
	if err := setTo(&foreign, &foreignMark); err != nil {
		return "", fmt.Errorf("rewrite checkpoint: %w", err)
	}
	origS := "NULL"
	if orig != nil {
		origS = *orig
	}
	desc := fmt.Sprintf("checkpoint %s %s (cluster %s) replaced with %s", ckptSystemIDCol, origS, own, foreign)

	in, err := r.conn.launch(ctx, "foreign-checkpoint")
	if err != nil {
		return "", err
	}
	took, line, exitErr := r.conn.expectExit(ctx, in, in.Start, opsExitTimeout, wantForeignSystem(foreign))
	if !in.exited() {
		// It accepted the foreign checkpoint; stop it before the fix.
		_ = r.conn.stop(time.Minute)
	}
	restore := r.rng.IntN(2) == 0
	if restore {
		err = setTo(orig, origMark)
		desc += "; restored"
	} else {
		err = r.ddl(ctx, fmt.Sprintf("DELETE FROM %s WHERE slot = %s", table.Sanitize(), sqlLiteral(&r.conn.slot, "text")))
		desc += "; deleted"
	}
	if err != nil {
		return "", fmt.Errorf("fix checkpoint: %w", err)
	}
	if exitErr != nil {
		r.opsFailed(fOpsForeignCkpt, "%v", exitErr)
		desc += "; " + exitErr.Error()
	} else {
		f.ExpectedExit = fmt.Sprintf("#%d exit 1 after %v: %s", in.N, took.Round(time.Millisecond), strings.TrimSpace(line))
		r.expectedExits = append(r.expectedExits, fOpsForeignCkpt+": "+f.ExpectedExit)
		desc += fmt.Sprintf("; connector #%d refused to start (exit 1 after %v)", in.N, took.Round(time.Millisecond))
	}
	return r.restartAfterStop(ctx, f, desc)
}

func (r *run) restartAfterStop(ctx context.Context, f *faultRecord, desc string) (string, error) {
	next, err := r.conn.start(ctx, "after-ops-exit")
	if next != nil {
		f.restarted = next.Start
	}
	if err != nil {
		return desc, fmt.Errorf("restart: %w", err)
	}
	return desc + fmt.Sprintf("; #%d ready in %v", next.N, next.Ready.Sub(next.Start).Round(time.Millisecond)), nil
}

// foreignSystemID returns a system identifier that is neither the
// checkpoint's nor the cluster's: the last digit changed.
func foreignSystemID(orig *string, own string) string {
	base := own
	if orig != nil && *orig != "" {
		base = *orig
	}
	for _, d := range []byte("1234567890") {
		last := base[len(base)-1]
		var v string
		if last >= '0' && last <= '9' {
			v = base[:len(base)-1] + string(d)
		} else {
			v = base + string(d)
		}
		if v != base && v != own && (orig == nil || v != *orig) {
			return v
		}
	}
	return "1"
}

// sqlLiteral renders v as a constant of type typ.
func sqlLiteral(v *string, typ string) string {
	if v == nil {
		return "NULL"
	}
	return "'" + strings.ReplaceAll(*v, "'", "''") + "'::text::" + typ
}

// opsOversize commits one event larger than its topic's max.message.bytes:
// the broker refuses it, and that record, only it, goes to the dead-letter
// topic with an error header (checked in analyze).
func (r *run) opsOversize(ctx context.Context) (string, error) {
	r.syncBig(ctx, fOpsOversize) // a quarantine it joins
	evs, err := r.big.commitNext(ctx)
	if err != nil {
		return "", err
	}
	r.noteBig(evs) // the quarantine it begins, or joins (redrive_test.go)
	e := evs[0]
	committed := time.Now()
	if err := r.commitAfterOversize(ctx); err != nil {
		return "", err
	}
	seen := "not on the dead-letter or parking topic within 30s"
	select {
	case <-r.live.watch(e.ID):
		at, _ := r.live.seenAt(e.ID)
		seen = fmt.Sprintf("consumed %v after its commit", at.Sub(committed).Round(time.Millisecond))
	case <-time.After(30 * time.Second): // a bound on the signal above, reported
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return fmt.Sprintf("event %s (%s seq %d, %d-byte pad, topic max.message.bytes %d, then %d that fit) %s",
		e.ID, e.Agg, e.Seq, oversizePad, bigTopicMaxBytes, afterOversize, seen), nil
}
