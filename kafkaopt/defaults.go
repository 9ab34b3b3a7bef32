// Package kafkaopt holds what the configuration states about the Kafka
// clients and the Kafka packages apply: the defaults, the compression
// codecs, and authentication (TLS, SASL, OAuth, MSK IAM) with the Secret
// type. internal/config imports it instead of the producer.
package kafkaopt

import (
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	// DefaultUnknownTopicTimeout is how long a record waits for a missing
	// topic: kafka.unknown_topic_timeout's default, and the sink's when 0.
	DefaultUnknownTopicTimeout = 2 * time.Minute
	// DefaultDrainTimeout is how long a stop waits for the records in
	// flight: kafka.drain_timeout's default, and the pipeline's when 0.
	DefaultDrainTimeout = 30 * time.Second
	// DefaultMaxBufferedRecords is kafka.max_buffered_records' default, the
	// one definition: internal/config's default and a sink Config with 0
	// both take it (for the client's buffer, the held records and
	// exactly_once's commit bound). 4,000 rather than franz-go's 10,000
	// bounds the peak memory of a drain (docs/performance.md).
	DefaultMaxBufferedRecords = 4_000
	// DefaultMaxQuarantined bounds quarantined keys (dlq.max_quarantined's
	// default, and the sink's when 0).
	DefaultMaxQuarantined = 10_000
	// DefaultTxnInterval is kafka.transaction_interval's default, and the
	// transactional sink's when 0.
	DefaultTxnInterval = 5 * time.Millisecond
	// DefaultTxnTimeout is kafka.transaction_timeout's default, and the
	// transactional sink's when 0: how long the broker lets a Kafka
	// transaction stay open. Short, because a connector that dies with one
	// open holds read_committed readers at it that long unless it restarts.
	DefaultTxnTimeout = time.Minute
	// DefaultLatencyBudget is kafka.latency_budget's default: how long a
	// record may wait so that its produce request carries the ones behind
	// it (sink/budget.go). Chosen from make bench's frontier of fixed lingers
	// and budgets (docs/performance.md, "The latency budget").
	DefaultLatencyBudget = 5 * time.Millisecond
)

// CodecFor is the codec of a kafka.compression value ("" is none).
func CodecFor(name string) (kgo.CompressionCodec, error) {
	if name == "" {
		return kgo.NoCompression(), nil
	}
	for _, c := range codecs {
		if c.name == name {
			return c.codec, nil
		}
	}
	names := Compressions()
	return kgo.CompressionCodec{}, fmt.Errorf("kafka.compression %q: use %s or %s", name,
		strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
}

// codecs are the kafka.compression values and their codecs.
var codecs = []struct {
	name  string
	codec kgo.CompressionCodec
}{
	{"none", kgo.NoCompression()},
	{"gzip", kgo.GzipCompression()},
	{"snappy", kgo.SnappyCompression()},
	{"lz4", kgo.Lz4Compression()},
	{"zstd", kgo.ZstdCompression()},
}

// Compressions lists the kafka.compression values the sink accepts ("" is
// none too).
func Compressions() []string {
	names := make([]string, len(codecs))
	for i, c := range codecs {
		names[i] = c.name
	}
	return names
}
