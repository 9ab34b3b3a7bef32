package cli

import (
	"cmp"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// cloudEvents returns kafka.format and its settings for the router, with
// the source's placeholders filled in. A DSN without a database connects to
// the one named like the user, as PostgreSQL does.
func cloudEvents(k config.Kafka, db *replication.DB, schema, table string) (string, router.CloudEvents) {
	database := cmp.Or(db.Database(), db.Config().User)
	return k.Format, router.CloudEvents{
		Source:      router.ExpandSource(k.CloudEvents.Source, database, schema, table),
		ContentType: k.CloudEvents.ContentType,
	}
}
