package sink_test

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestDefaultsOneDefinition: the configuration's defaults are the sink's,
// and a sink.Config that leaves them 0 gets the same bounds (the client's
// buffer was franz-go's 10,000 while internal/config said 4,000).
func TestDefaultsOneDefinition(t *testing.T) {
	d := config.Default()
	if d.Kafka.MaxBufferedRecords != kafkaopt.DefaultMaxBufferedRecords || d.DLQ.MaxQuarantined != kafkaopt.DefaultMaxQuarantined ||
		d.Kafka.UnknownTopicTimeout != kafkaopt.DefaultUnknownTopicTimeout || d.Kafka.DrainTimeout != kafkaopt.DefaultDrainTimeout ||
		d.Kafka.TransactionInterval != kafkaopt.DefaultTxnInterval {
		t.Fatalf("config defaults %d, %d, %v; sink defaults %d, %d, %v", d.Kafka.MaxBufferedRecords, d.DLQ.MaxQuarantined,
			d.Kafka.UnknownTopicTimeout, kafkaopt.DefaultMaxBufferedRecords, kafkaopt.DefaultMaxQuarantined, kafkaopt.DefaultUnknownTopicTimeout)
	}
	s := newSink(t, sinktest.NewCluster(t), nil)
	if got := s.Client().OptValue(kgo.MaxBufferedRecords); got != int64(d.Kafka.MaxBufferedRecords) {
		t.Fatalf("a sink with MaxBufferedRecords 0 buffers %v records in the client, want %d", got, d.Kafka.MaxBufferedRecords)
	}
}
