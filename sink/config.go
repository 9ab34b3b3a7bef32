package sink

import (
	"log/slog"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/backoff"
	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// Config is the producer configuration (the kafka section of the config file).
type Config struct {
	Brokers            []string
	ClientID           string
	DLQTopic           string
	MaxBufferedRecords int
	MaxBufferedBytes   int64
	Linger             time.Duration
	// LatencyBudget lets a record wait in the sink's gate, when more are
	// expected, for up to this less the round trip (budget.go); 0: off.
	LatencyBudget  time.Duration
	RequestTimeout time.Duration
	Compression    string // none, gzip, snappy, lz4, zstd
	// AutoCreateTopics creates a missing topic, with TopicPartitions and
	// TopicReplicationFactor, unless the broker forbids auto-creation
	// (auto.create.topics.enable=false).
	AutoCreateTopics bool
	// TopicPartitions and TopicReplicationFactor apply to topics the sink
	// creates; 0 or -1 leaves them to the broker's defaults.
	TopicPartitions        int32
	TopicReplicationFactor int16
	// UnknownTopicTimeout is how long records wait for a missing topic
	// before they are dead-lettered; 0 means 2m.
	UnknownTopicTimeout time.Duration
	// ParkingTopic turns quarantine on (dlq.mode quarantine): once a record
	// is dead-lettered, later records with its key go to this topic
	// (package sink/quarantine). "" keeps dlq.mode skip.
	ParkingTopic string
	// MaxQuarantined bounds the quarantined keys; 0 means 10000.
	MaxQuarantined int
	// QuarantineTopic, with ParkingTopic, saves quarantines on this
	// compacted topic under QuarantineSource's keys and carries out
	// redrive requests (sink/quarantine); "" keeps them in memory.
	QuarantineTopic  string
	QuarantineSource string
	// Redrives, when set, is told each redrive's result (quarantine.RedriveDone, …;
	// "" when the set changed otherwise: a quarantine started, restored,
	// lifted) and how many keys are quarantined: the one source of the
	// quarantined count. It may run with the quarantine's lock held: it must not
	// call the sink.
	Redrives func(result string, quarantined int)
	// Owner, when set, says whether this process may carry out redrive
	// requests now: only the one streaming from the slot writes the keys'
	// events (an active-standby pair shares the state topic's keys).
	Owner func() bool
	// Contracts, when set, checks what a redrive republishes against the
	// event contracts' latest versions (quarantine.Revalidator).
	Contracts quarantine.Revalidator
	// Fail, when set, is told of an error that stops the sink from working
	// after New: the quarantine topic found not compacted once Kafka answered.
	Fail func(error)
	// Security is kafka.tls and kafka.sasl, for every client of the sink.
	Security kafkaopt.Security
	// SecurityLog, when set, is told (at most once a minute per client) why
	// connections fail on TLS or SASL: the client retries those failures
	// like any connection failure, so nothing else would say why nothing
	// gets out.
	SecurityLog *slog.Logger
	// RetryEOF retries a request whose connection the broker closed (run:
	// a broker restarting; the one-shot commands fail fast instead).
	RetryEOF bool
	// TestOpts are extra franz-go options for tests (a dialer, short
	// backoffs), applied after the sink's own; production settings are the
	// fields above.
	TestOpts []kgo.Opt
}

// ConnOpts are what every client of cfg's cluster takes: its brokers, the
// client id, authentication and the security log.
func (cfg Config) ConnOpts() ([]kgo.Opt, error) {
	sec, err := kafkaopt.SecurityOpts(cfg.Security)
	if err != nil {
		return nil, err
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ClientID(cfg.ClientID)}, sec...)
	if cfg.SecurityLog != nil {
		opts = append(opts, kafkaopt.SecurityFailureLog(cfg.SecurityLog, time.Minute))
	}
	if cfg.RetryEOF {
		opts = append(opts, kafkaopt.RetryEOF())
	}
	return opts, nil
}

// creation is how the producers create event topics.
func (cfg Config) creation() kafka.Creation {
	return kafka.Creation{Auto: cfg.AutoCreateTopics, Partitions: cfg.TopicPartitions, Replication: cfg.TopicReplicationFactor}
}

// BufferedRecords is kafka.max_buffered_records, or its default.
func (cfg Config) BufferedRecords() int {
	if cfg.MaxBufferedRecords <= 0 {
		return kafkaopt.DefaultMaxBufferedRecords
	}
	return cfg.MaxBufferedRecords
}

// TopicWait is how long records wait for a missing topic
// (kafka.unknown_topic_timeout, or its default) and how often it is
// looked for meanwhile.
func (cfg Config) TopicWait() (timeout, poll time.Duration) {
	timeout = cfg.UnknownTopicTimeout
	if timeout <= 0 {
		timeout = kafkaopt.DefaultUnknownTopicTimeout
	}
	return timeout, min(max(timeout/20, 50*time.Millisecond), time.Second)
}

// ProducerOpts are conn (ConnOpts) and the settings both producers (the
// idempotent sink and sink/exactlyonce's transactional one) produce with;
// batchMax caps each topic's batches (ProducerBatchMaxBytesFn). The caller
// adds its own options, then TestOpts.
func (cfg Config) ProducerOpts(conn []kgo.Opt, log *slog.Logger, batchMax func(topic string) int32) ([]kgo.Opt, error) {
	codec, err := kafkaopt.CodecFor(cfg.Compression)
	if err != nil {
		return nil, err
	}
	opts := append(slices.Clip(conn),
		// acks=all is required by, and the default of, the idempotent producer;
		// said explicitly because guarantee 4 rests on it.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// Keyed records hash with murmur2 like the Java client, so the same
		// aggregate_id lands in the same partition for every producer.
		// A record with a partition column's value keeps it (partitioner).
		kgo.RecordPartitioner(kafka.NewPartitioner()),
		kgo.ProducerLinger(cfg.Linger),
		kgo.ProducerBatchCompression(codec),
		// A batch over the topic's limit is refused whole: cap each topic's
		// batches at it (learned before its first record is produced).
		kgo.ProducerBatchMaxBytesFn(batchMax),
		// franz-go resets its sequence numbers and carries on; say so loudly.
		kgo.ProducerOnDataLossDetected(func(topic string, partition int32) {
			log.Error("kafka: data loss detected: the broker lost records it had acknowledged (unclean leader election or truncation); producing continues",
				"topic", topic, "partition", partition)
		}),
		// Retry quickly after a broker comes back: franz-go's default backoff
		// grows to seconds, which is what recovery after an outage then takes.
		kgo.RetryBackoffFn(func(tries int) time.Duration {
			return backoff.Jitter(backoff.Nth(100*time.Millisecond, time.Second, tries))
		}),
		kgo.MaxBufferedRecords(cfg.BufferedRecords()),
	)
	if cfg.MaxBufferedBytes > 0 {
		opts = append(opts, kgo.MaxBufferedBytes(int(cfg.MaxBufferedBytes)))
	}
	if cfg.RequestTimeout > 0 {
		opts = append(opts, kgo.ProduceRequestTimeout(cfg.RequestTimeout))
	}
	return opts, nil
}
