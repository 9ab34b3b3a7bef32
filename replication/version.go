package replication

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The PostgreSQL versions outbox-cdc supports and is tested on (make matrix).
const (
	MinServerVersion = 13
	MaxServerVersion = 18
	// messagesVersion: pgoutput's "messages" option (PG docs, "Logical
	// Streaming Replication Parameters") arrived in PostgreSQL 14.
	messagesVersion = 14
)

// ServerMajor reads the server's major version (server_version_num / 10000).
func ServerMajor(ctx context.Context, conn *pgx.Conn) (int, string, error) {
	var num int
	var text string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").
		Scan(&num, &text); err != nil {
		return 0, "", fmt.Errorf("read server version: %w", err)
	}
	return num / 10000, text, nil
}

// checkVersion adds a problem for a server outside the supported range and
// for each configured feature the server is too old for.
func checkVersion(ctx context.Context, conn *pgx.Conn, src Source, add func(problem, fix string)) error {
	major, text, err := ServerMajor(ctx, conn)
	if err != nil {
		return err
	}
	if major < MinServerVersion {
		add(fmt.Sprintf("PostgreSQL %s is not supported (outbox-cdc supports %d to %d)", text, MinServerVersion, MaxServerVersion),
			fmt.Sprintf("upgrade PostgreSQL to %d or later", MinServerVersion))
		return nil
	}
	if src.Messages && major < messagesVersion {
		add(fmt.Sprintf("outbox.message_prefix needs PostgreSQL %d or later (pgoutput sends logical decoding messages from %d on); this server is %s",
			messagesVersion, messagesVersion, text),
			"upgrade PostgreSQL, or write events to the outbox table and unset outbox.message_prefix")
	}
	if src.Failover == FailoverOn && major < failoverVersion {
		add(fmt.Sprintf("postgres.failover_slot is on, but failover slots need PostgreSQL %d or later; this server is %s", failoverVersion, text),
			fmt.Sprintf("upgrade PostgreSQL to %d, or set postgres.failover_slot: auto to run without a slot a standby can take over", failoverVersion))
	}
	return nil
}

// Major reads the server's major version on a connection of its own.
func (d *DB) Major(ctx context.Context) (int, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return 0, fmt.Errorf("connect: %w", classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	major, _, err := ServerMajor(ctx, conn)
	return major, err
}
