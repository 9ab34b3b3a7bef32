package cli

import (
	"testing"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// TestCloudEventsSource: the source's placeholders are the DSN's database
// (the user's name when it has none, as PostgreSQL defaults it) and the
// outbox table.
func TestCloudEventsSource(t *testing.T) {
	t.Setenv("PGDATABASE", "") // pgx reads them; empty is unset
	t.Setenv("PGUSER", "")
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://app@db:5432/shop", "/outbox-cdc/shop/sales.outbox"},
		{"postgres://app@db:5432", "/outbox-cdc/app/sales.outbox"},
		{"host=db user=app dbname='my shop'", "/outbox-cdc/my%20shop/sales.outbox"},
	} {
		db, err := replication.ParseDB(tc.dsn, nil)
		if err != nil {
			t.Fatal(err)
		}
		k := config.Default().Kafka
		k.Format, k.CloudEvents.ContentType = router.FormatCEBinary, "text/csv"
		format, ce := cloudEvents(k, db, "sales", "outbox")
		if format != router.FormatCEBinary || ce.Source != tc.want || ce.ContentType != "text/csv" {
			t.Errorf("%s: %q %+v, want source %q", tc.dsn, format, ce, tc.want)
		}
	}
}
