package sink

import (
	"log/slog"
	"time"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/twmb/franz-go/pkg/kgo"
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
	// extra are options of the package's own producers (the transactional
	// one), applied after the sink's and before TestOpts.
	extra []kgo.Opt
}

// connOpts are what every client of cfg's cluster takes: its brokers, the
// client id, authentication and the security log.
func (cfg Config) connOpts() ([]kgo.Opt, error) {
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
