package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Partitions of a partitioned outbox (range on created_at) that the
// connector makes ahead and drops behind (docs/operations.md, "Partitioned
// outbox"). A partition it made carries a comment naming its root and its
// bounds; partitions without it (attached by hand, the default partition,
// pg_partman's) are never touched.

// partitionMark starts the comment of a partition the connector made:
// "outbox-cdc partition of <root> [from, to)", bounds in RFC 3339 UTC.
const partitionMark = "outbox-cdc partition of "

// Partition is one partition the connector made.
type Partition struct {
	Name     string // unquoted, in the root's schema
	From, To time.Time
	// Attached: still a partition of the root; DetachPending: a DETACH
	// CONCURRENTLY was cut short (FINALIZE completes it).
	Attached, DetachPending bool
}

func (r *Retainer) mark(from, to time.Time) string {
	return fmt.Sprintf("%s%s.%s [%s, %s)", partitionMark, r.schema, r.name, from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339))
}

// parseMark returns the bounds in comment if it marks a partition of this root.
func (r *Retainer) parseMark(comment string) (from, to time.Time, ok bool) {
	rest, ok := strings.CutPrefix(comment, partitionMark+r.schema+"."+r.name+" [")
	if !ok {
		return time.Time{}, time.Time{}, false
	}
	a, b, ok := strings.Cut(strings.TrimSuffix(rest, ")"), ", ")
	if !ok {
		return time.Time{}, time.Time{}, false
	}
	from, err1 := time.Parse(time.RFC3339, a)
	to, err2 := time.Parse(time.RFC3339, b)
	return from, to, err1 == nil && err2 == nil
}

// PartitionName is the name of the partition starting at from: the root's
// name (cut so the whole fits PostgreSQL's 63 bytes) and the start, UTC.
func PartitionName(root string, from time.Time) string {
	const suffix = len("_p20060102_150405")
	if len(root) > 63-suffix {
		root = root[:63-suffix]
	}
	return root + "_p" + from.UTC().Format("20060102_150405")
}

// Partitions lists the partitions the connector made of this root,
// attached, pending detach, or detached and not dropped yet: one pending
// detach first (PostgreSQL refuses any other DETACH … CONCURRENTLY on the
// root until it is finalized, and a round stops at its first error), then
// by start.
func (r *Retainer) Partitions(ctx context.Context) ([]Partition, error) {
	conn, err := r.connect(ctx)
	if err != nil {
		return nil, err
	}
	pending := "false"
	if r.major >= 14 {
		pending = "coalesce(i.inhdetachpending, false)"
	}
	rows, err := conn.Query(ctx, `SELECT c.relname, d.description, i.inhrelid IS NOT NULL, `+pending+`
	FROM pg_class c JOIN pg_description d ON d.objoid = c.oid AND d.classoid = 'pg_class'::regclass AND d.objsubid = 0
	LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = $1
	WHERE c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = $1) AND c.relkind = 'r' AND d.description LIKE $2`,
		r.relid, partitionMark+"%")
	if err != nil {
		r.drop(ctx)
		return nil, fmt.Errorf("retention %s: list partitions: %w", r.table, err)
	}
	var out []Partition
	for rows.Next() {
		var p Partition
		var comment string
		if err := rows.Scan(&p.Name, &comment, &p.Attached, &p.DetachPending); err != nil {
			rows.Close()
			return nil, fmt.Errorf("retention %s: list partitions: %w", r.table, err)
		}
		var ok bool
		if p.From, p.To, ok = r.parseMark(comment); ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Partition) int {
		if a.DetachPending != b.DetachPending {
			if a.DetachPending {
				return -1
			}
			return 1
		}
		return a.From.Compare(b.From)
	})
	return out, rows.Err()
}

// ErrPartitionOverlap: a partition the connector did not make (attached by
// hand, pg_partman's) covers part of the range, or the default partition
// holds rows in it; the connector leaves that range to its owner.
var ErrPartitionOverlap = errors.New("the range is covered by a partition the connector did not make, or the default partition has rows in it")

// CreatePartition creates the partition [from, to) with its mark, in one
// transaction; created is false when it exists already.
func (r *Retainer) CreatePartition(ctx context.Context, from, to time.Time) (created bool, err error) {
	conn, err := r.connect(ctx)
	if err != nil {
		return false, err
	}
	name := pgx.Identifier{r.schema, PartitionName(r.name, from)}.Sanitize()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists); err != nil || exists {
			return err
		}
		// A short lock wait: creating takes a lock on the root that inserts wait behind.
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (%s) TO (%s)", name, r.table,
			quoteLiteral(from.UTC().Format(time.RFC3339)), quoteLiteral(to.UTC().Format(time.RFC3339)))); err != nil {
			return err
		}
		created = true
		_, err := tx.Exec(ctx, fmt.Sprintf("COMMENT ON TABLE %s IS %s", name, quoteLiteral(r.mark(from, to))))
		return err
	})
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && (pe.Code == "42P17" || pe.Code == "23514"): // overlap; the default partition's rows
		return false, fmt.Errorf("retention %s: partition [%s, %s): %w (%s)", r.table, from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339), ErrPartitionOverlap, pe.Message)
	case err != nil:
		r.drop(ctx)
		return false, fmt.Errorf("retention %s: create partition: %w", r.table, err)
	}
	return created, nil
}

// DropPartition detaches p and drops it, once every row in it is
// delivered (its xmin precedes below), and not while verify runs (done
// false, nil). The rows are checked under a SHARE
// lock (no insert meanwhile) before the detach, and again before the drop
// (a row inserted between the two is still in the detached table). done is
// false when rows wait: the next round tries again, finding p by its mark.
func (r *Retainer) DropPartition(ctx context.Context, p Partition, below uint64) (done bool, err error) {
	conn, err := r.connect(ctx)
	if err != nil {
		return false, err
	}
	name := pgx.Identifier{r.schema, p.Name}.Sanitize()
	delivered := "SELECT NOT EXISTS (SELECT 1 FROM " + name + " WHERE NOT " + fmt.Sprintf(xidPrecedes, "xmin::text::bigint", "$1::bigint") + ")"
	below32 := int64(below & 0xffffffff)
	defer func() {
		if err != nil {
			r.drop(ctx)
			err = fmt.Errorf("retention %s: drop partition %s: %w", r.table, p.Name, err)
		}
	}()
	// verify reads the rows through the root: the lock it shares with the
	// delete batches, held for the detach and the drop.
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", RetentionLockKey(r.relid)).Scan(&locked); err != nil || !locked {
		return false, err
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", RetentionLockKey(r.relid))
	}()
	if p.DetachPending { // a detach cut short (kill -9): complete it
		if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s FINALIZE", r.table, name)); err != nil {
			return false, err
		}
		p.Attached = false
	}
	if p.Attached {
		ok := false
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "LOCK TABLE "+name+" IN SHARE MODE"); err != nil {
				return err
			}
			return tx.QueryRow(ctx, delivered, below32).Scan(&ok)
		})
		if err != nil || !ok {
			return false, err
		}
		detach := fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", r.table, name)
		if r.major >= 14 {
			detach += " CONCURRENTLY" // SHARE UPDATE EXCLUSIVE on the root: inserts go on
		}
		if _, err := conn.Exec(ctx, detach); err != nil {
			return false, err
		}
	}
	var ok bool
	if err := conn.QueryRow(ctx, delivered, below32).Scan(&ok); err != nil || !ok {
		return false, err
	}
	// Short, and not cut by a stop: a drop the server committed is one the
	// caller counts.
	if _, err := conn.Exec(context.WithoutCancel(ctx), "DROP TABLE "+name); err != nil {
		return false, err
	}
	return true, nil
}

// checkPartitioned adds a problem for what managing the partitions of a
// partitioned outbox needs: range partitioning on created_at alone, and
// ownership of the root (CREATE TABLE … PARTITION OF and DETACH need it).
func checkPartitioned(ctx context.Context, conn *pgx.Conn, table, role string, add func(problem, fix string)) error {
	var byCreatedAt, owner bool
	err := conn.QueryRow(ctx, `SELECT p.partstrat = 'r' AND p.partnatts = 1 AND a.attname IS NOT DISTINCT FROM $2,
	       pg_has_role(c.relowner, 'USAGE')
	FROM pg_class c JOIN pg_partitioned_table p ON p.partrelid = c.oid
	LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = p.partattrs[0]
	WHERE c.oid = to_regclass($1)`, table, RetentionColumn).Scan(&byCreatedAt, &owner)
	if err != nil {
		return fmt.Errorf("check partitions of %s: %w", table, err)
	}
	if !byCreatedAt {
		add(fmt.Sprintf("outbox.retention: %s is not partitioned by range on %s alone; the connector manages only such partitions", table, RetentionColumn),
			"partition it BY RANGE (created_at) (docs/guide.md), or unset outbox.retention and manage the partitions yourself")
	}
	if !owner {
		add(fmt.Sprintf("outbox.retention: role %q does not own %s, which creating and detaching its partitions needs", role, table),
			fmt.Sprintf("run ALTER TABLE %s OWNER TO %s (or GRANT the owning role to it), or unset outbox.retention", table, pgx.Identifier{role}.Sanitize()))
	}
	return nil
}
