package offsets_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/offsets/offsetstest"
)

// TestFileStoreRepairHold: the file store keeps a lost slot's repair hold
// as every store must (offsetstest.RepairHold).
func TestFileStoreRepairHold(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offsetstest.RepairHold(ctx, t, offsets.NewFileStore(filepath.Join(t.TempDir(), "checkpoint")))
}
