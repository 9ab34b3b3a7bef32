package exactlyonce_test

import (
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// The topics sinktest.NewCluster seeds.
const (
	topic = sinktest.Topic
	dlq   = sinktest.DLQ
)
