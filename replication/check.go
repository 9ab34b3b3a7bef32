package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
)

// Check verifies the server prerequisites. It returns every problem it finds,
// joined, each a *fault.PrerequisiteError, or a connection error.
func Check(ctx context.Context, src Source) error {
	conn, err := src.DB.connect(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return check(ctx, conn, src)
}

func check(ctx context.Context, conn *pgx.Conn, src Source) error {
	var problems []error
	add := func(problem, fix string) {
		problems = append(problems, &fault.PrerequisiteError{Problem: problem, Fix: fix})
	}

	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		add(fmt.Sprintf("wal_level is %q, logical decoding needs \"logical\"", walLevel),
			"set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL")
	}
	if err := checkVersion(ctx, conn, src, add); err != nil {
		return err
	}
	facts, err := readStandbyFacts(ctx, conn, src)
	if err != nil {
		return err
	}
	for _, p := range facts.problems() {
		problems = append(problems, p)
	}
	primary, err := checkPrimary(ctx, conn, src)
	if err != nil {
		return err
	}
	for _, p := range primary {
		problems = append(problems, p)
	}
	var canReplicate bool
	var role string
	if err := conn.QueryRow(ctx,
		"SELECT current_user, rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&role, &canReplicate); err != nil {
		return fmt.Errorf("read role: %w", err)
	}
	if !canReplicate {
		add(fmt.Sprintf("role %q has no REPLICATION privilege", role),
			fmt.Sprintf("run ALTER ROLE %s WITH REPLICATION as a superuser", pgx.Identifier{role}.Sanitize()))
	}
	for _, t := range src.Tables() {
		if err := checkTable(ctx, conn, t, role, add); err != nil {
			return err
		}
		if src.Retention {
			if err := checkRetention(ctx, conn, t, role, add); err != nil {
				return err
			}
		}
	}
	return errors.Join(problems...)
}

// checkTable checks src's outbox table: it exists, the role can read it,
// and it has the mapped columns.
func checkTable(ctx context.Context, conn *pgx.Conn, src Source, role string, add func(problem, fix string)) error {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", src.qualified()).Scan(&exists); err != nil {
		return fmt.Errorf("look up table: %w", err)
	}
	if !exists {
		add(fmt.Sprintf("outbox table %s does not exist", src.qualified()),
			"create it (see sql/outbox.sql) or set outbox.table (or the entry's table in outbox.tables) to the right schema.table")
		return nil
	}
	var canSelect bool
	if err := conn.QueryRow(ctx, "SELECT has_table_privilege($1, 'SELECT')", src.qualified()).Scan(&canSelect); err != nil {
		return fmt.Errorf("check privilege: %w", err)
	}
	if !canSelect {
		add(fmt.Sprintf("role %q cannot SELECT from %s", role, src.qualified()),
			fmt.Sprintf("run GRANT SELECT ON %s TO %s", src.qualified(), pgx.Identifier{role}.Sanitize()))
	}
	rows, err := conn.Query(ctx, `SELECT attname FROM pg_attribute
	WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, src.qualified())
	if err != nil {
		return fmt.Errorf("read columns: %w", err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read columns: %w", err)
	}
	have := make(map[string]bool, len(cols))
	for _, c := range cols {
		have[c] = true
	}
	for _, c := range src.Columns {
		if !have[c] {
			add(fmt.Sprintf("column %q is missing from %s (it has %s)", c, src.qualified(), strings.Join(cols, ", ")),
				"map the right column under outbox.columns or outbox.header_columns")
		}
	}
	return nil
}
