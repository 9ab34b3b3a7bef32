package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
)

// EnsurePublication creates the publication if it is missing and checks it
// publishes inserts of the outbox table.
func EnsurePublication(ctx context.Context, src Source) error {
	conn, err := src.DB.connect(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var recovery, exists bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery(), EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)",
		src.Publication).Scan(&recovery, &exists); err != nil {
		return fmt.Errorf("read publication: %w", err)
	}
	if recovery && !exists {
		if err := publishOnPrimary(ctx, conn, src); err != nil {
			return err
		}
	}
	return ensurePublication(ctx, conn, src)
}

// publishOnPrimary creates the publication a standby lacks on its primary
// (a standby is read-only; the catalog row reaches it by replay) and waits
// until the standby has replayed it.
func publishOnPrimary(ctx context.Context, conn *pgx.Conn, src Source) error {
	if src.Primary == nil {
		create, _, err := createPublication(ctx, conn, src)
		if err != nil {
			return err
		}
		return &fault.PrerequisiteError{
			Problem: fmt.Sprintf("publication %s does not exist, and the server is a standby where it cannot be created", src.Publication),
			Fix:     "run on the primary: " + create + "; or set postgres.primary_dsn so the connector creates it there",
		}
	}
	pc, err := src.Primary.connect(ctx)
	if err != nil {
		return fmt.Errorf("connect to postgres.primary_dsn: %w", classify(err))
	}
	defer pc.Close(context.WithoutCancel(ctx))
	if err := ensurePublication(ctx, pc, src); err != nil {
		return fmt.Errorf("on the primary: %w", err)
	}
	var at string
	if err := pc.QueryRow(ctx, "SELECT "+walPosition+"::text").Scan(&at); err != nil {
		return fmt.Errorf("on the primary: read wal position: %w", err)
	}
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var replayed bool
		err := conn.QueryRow(wait, "SELECT "+walPosition+" >= $1::pg_lsn", at).Scan(&replayed)
		if err != nil {
			return fmt.Errorf("wait for the standby to replay publication %s: %w", src.Publication, err)
		}
		if replayed {
			return nil
		}
		select {
		case <-wait.Done():
			return fmt.Errorf("wait for the standby to replay publication %s (created on the primary at %s): %w", src.Publication, at, wait.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// createPublication returns the statement that creates the publication for
// every outbox table, and which of them are partitioned.
func createPublication(ctx context.Context, conn *pgx.Conn, src Source) (sql string, partitioned []bool, err error) {
	var names []string
	anyPartitioned := false
	for _, t := range src.Tables() {
		var relkind string
		if err := conn.QueryRow(ctx, "SELECT coalesce((SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)), '')",
			t.qualified()).Scan(&relkind); err != nil {
			return "", nil, fmt.Errorf("read table kind: %w", err)
		}
		names = append(names, t.qualified())
		partitioned = append(partitioned, relkind == "p")
		anyPartitioned = anyPartitioned || relkind == "p"
	}
	// A partitioned outbox is published under its root's name only with
	// publish_via_partition_root (PG docs, CREATE PUBLICATION); otherwise
	// each row arrives as an insert into its partition, which is not the
	// configured table. With it, partitions attached later are covered too.
	// publish = 'insert': UPDATEs and DELETEs of outbox rows (cleanup jobs)
	// are never even decoded into the stream.
	with := "publish = 'insert'"
	if anyPartitioned {
		with += ", publish_via_partition_root = true"
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (%s)",
		pgx.Identifier{src.Publication}.Sanitize(), strings.Join(names, ", "), with), partitioned, nil
}

func ensurePublication(ctx context.Context, conn *pgx.Conn, src Source) error {
	sql, partitioned, err := createPublication(ctx, conn, src)
	if err != nil {
		return err
	}
	var pubInsert, viaRoot bool
	err = conn.QueryRow(ctx, "SELECT pubinsert, pubviaroot FROM pg_publication WHERE pubname = $1", src.Publication).Scan(&pubInsert, &viaRoot)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := conn.Exec(ctx, sql); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42501" {
				return &fault.PrerequisiteError{
					Problem: fmt.Sprintf("cannot create publication %s: %s", src.Publication, pgErr.Message),
					Fix:     "have the table owner run: " + sql,
				}
			}
			return fmt.Errorf("create publication: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read publication: %w", err)
	}
	pub := pgx.Identifier{src.Publication}.Sanitize()
	if !pubInsert {
		return &fault.PrerequisiteError{
			Problem: fmt.Sprintf("publication %s does not publish inserts", src.Publication),
			Fix:     fmt.Sprintf("run ALTER PUBLICATION %s SET (publish = 'insert')", pub),
		}
	}
	for i, t := range src.Tables() {
		if partitioned[i] && !viaRoot {
			return &fault.PrerequisiteError{
				Problem: fmt.Sprintf("publication %s publishes the partitions of %s under their own names (publish_via_partition_root is off), "+
					"so their rows would not be recognised as outbox rows", src.Publication, t.qualified()),
				Fix: fmt.Sprintf("run ALTER PUBLICATION %s SET (publish_via_partition_root = true)", pub),
			}
		}
		var member bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables
			WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)`, src.Publication, t.Schema, t.Table).Scan(&member); err != nil {
			return fmt.Errorf("read publication tables: %w", err)
		}
		if !member {
			return &fault.PrerequisiteError{
				Problem: fmt.Sprintf("publication %s does not include %s", src.Publication, t.qualified()),
				Fix:     fmt.Sprintf("run ALTER PUBLICATION %s ADD TABLE %s", pub, t.qualified()),
			}
		}
	}
	return nil
}
