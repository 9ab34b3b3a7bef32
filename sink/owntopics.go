package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// The connector's own topics (dead-letter, parking, quarantine state) are
// known at start. They are checked, and created when missing, before the
// first record is produced: a broker that forbids auto-creation would
// otherwise hold the first dead letter, and every later event of its
// aggregate, for kafka.unknown_topic_timeout. They are created whatever
// kafka.auto_create_topics says, as the positions topic is
// (sink/exactlyonce/start.go): the connector cannot work without them. The
// positions topic is not here: exactly_once's start creates and checks it.

// keepForever is retention.ms and retention.bytes for records nothing may
// delete: a parked event or a dead letter deleted before its redrive, by
// age or by the partition's size, is an event lost.
const keepForever = "-1"

// keptConfigs is what a topic whose records are kept is created with: -1
// on the topic, so that a broker's finite log.retention.bytes or
// log.retention.ms does not show through.
func keptConfigs() map[string]string {
	return map[string]string{"retention.ms": keepForever, "retention.bytes": keepForever}
}

// ownTopic is one of the connector's own topics and how it is created.
type ownTopic struct {
	name, role string
	partitions int32 // -1: the broker's default
	configs    map[string]string
	// keep: finite retention on an existing topic is worth a warning.
	keep bool
	// compacted: the topic must be compacted (the quarantine state).
	compacted bool
}

// ownTopics lists cfg's own topics: the dead-letter topic always, the
// parking and quarantine state topics in dlq.mode quarantine.
func ownTopics(cfg Config) []ownTopic {
	parts := cfg.TopicPartitions
	if parts == 0 {
		parts = -1
	}
	parks := cfg.ParkingTopic != ""
	var out []ownTopic
	if cfg.DLQTopic != "" {
		// In quarantine mode a redrive republishes the dead letter from
		// its offset, so it is kept like the parked events after it; in
		// skip mode it is the only copy of a refused event, so it is
		// kept too: an operator deletes dead letters, not the broker.
		out = append(out, ownTopic{name: cfg.DLQTopic, role: "dead-letter", partitions: parts,
			configs: keptConfigs(), keep: parks})
	}
	if parks {
		out = append(out, ownTopic{name: cfg.ParkingTopic, role: "parking", partitions: parts,
			configs: keptConfigs(), keep: true})
	}
	if parks && cfg.QuarantineTopic != "" {
		// As ensureStateTopic creates it: one partition.
		out = append(out, ownTopic{name: cfg.QuarantineTopic, role: "quarantine state", partitions: 1,
			configs: quarantine.StateTopicConfigs, compacted: true})
	}
	return out
}

// OwnTopicError is an own topic that is missing and that the cluster
// refuses to create, or that exists with settings that lose records.
type OwnTopicError struct {
	Topic, Role string
	Problem     string // what is wrong
	Fix         string // the command that fixes it
	Err         error  // the cluster's answer, if any
}

func (e *OwnTopicError) Error() string { return e.What() + "; " + e.Fix }

// What is the error without its fix.
func (e *OwnTopicError) What() string {
	s := fmt.Sprintf("the %s topic %s %s", e.Role, e.Topic, e.Problem)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *OwnTopicError) Unwrap() error { return e.Err }

// createCommand is the kafka-topics.sh command that creates o as the
// connector would.
func (o ownTopic) createCommand(brokers []string, replication int16) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kafka-topics.sh --bootstrap-server %s --create --topic %s", strings.Join(brokers, ","), o.name)
	if o.partitions > 0 {
		fmt.Fprintf(&b, " --partitions %d", o.partitions)
	}
	if replication > 0 {
		fmt.Fprintf(&b, " --replication-factor %d", replication)
	}
	for _, k := range slices.Sorted(maps.Keys(o.configs)) {
		fmt.Fprintf(&b, " --config %s=%s", k, o.configs[k])
	}
	return b.String()
}

// EnsureOwnTopics checks cfg's own topics and creates the missing ones
// (create false, for check: asks the cluster whether it would, creating
// nothing). It returns an *OwnTopicError when the cluster refuses, or any
// other error when it cannot be asked (not reachable): the caller decides
// whether to wait. Settings that may lose records on an existing topic are
// logged as warnings; those of the quarantine state topic are an error.
func EnsureOwnTopics(ctx context.Context, cfg Config, create bool, log *slog.Logger) error {
	topics := ownTopics(cfg)
	if len(topics) == 0 {
		return nil
	}
	opts, err := cfg.ConnOpts()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(opts, cfg.TestOpts...)...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	repl := cfg.TopicReplicationFactor
	if repl == 0 {
		repl = -1
	}
	for _, o := range topics {
		if err := ensureOwnTopic(ctx, adm, o, cfg.Brokers, repl, create, log); err != nil {
			return err
		}
	}
	return nil
}

func ensureOwnTopic(ctx context.Context, adm *kadm.Client, o ownTopic, brokers []string, repl int16, create bool, log *slog.Logger) error {
	got, err := kafka.EnsureTopic(ctx, adm, kafka.TopicSpec{Name: o.name, Label: o.role + " topic " + o.name,
		Partitions: o.partitions, Replication: repl, Configs: o.configs, KeepLast: o.compacted,
		Validate: !create, MayBeUnreadable: true})
	var (
		te *kafka.TopicError
		nk *kafka.NotKeptError
	)
	switch {
	case errors.As(err, &nk):
		return &quarantine.NotCompactedError{Topic: o.name, Policy: nk.Policy}
	case errors.As(err, &te) && te.Op == "create" && te.Refused():
		return &OwnTopicError{Topic: o.name, Role: o.role, Err: te.Err,
			Problem: "does not exist and the cluster refuses to create it",
			Fix:     "create it: " + o.createCommand(brokers, repl)}
	case err != nil:
		return err
	}
	switch got.Found {
	case kafka.Exists:
		warnOwnTopic(o, got.Configs, log)
	case kafka.Unreadable: // not authorized to describe, say: producing will tell
		log.Warn("kafka: cannot read the settings of the connector's own topic", "role", o.role, "topic", o.name, "err", got.Err)
	case kafka.Created:
		if create {
			log.Info("kafka: created the connector's own topic", "role", o.role, "topic", o.name,
				"partitions", got.Partitions, "replication_factor", got.Replication, "configs", o.configs)
		} else {
			log.Info("kafka: the connector's own topic does not exist; the connector creates it at start", "role", o.role, "topic", o.name, "configs", o.configs)
		}
	}
	return nil // CreatedMeanwhile: by another instance
}

// warnOwnTopic warns of an existing own topic's settings that may lose
// records; the quarantine state topic's compaction is EnsureTopic's to
// check (TopicSpec.KeepLast).
func warnOwnTopic(o ownTopic, configs []kadm.Config, log *slog.Logger) {
	for _, c := range configs {
		switch v := c.MaybeValue(); {
		case c.Key == "cleanup.policy" && o.keep && kafka.Compacts(v):
			log.Warn("kafka: the connector's own topic is compacted: a key's older records in it are deleted before a redrive reads them",
				"role", o.role, "topic", o.name, "cleanup.policy", v,
				"fix", fmt.Sprintf("kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config cleanup.policy=delete,retention.ms=-1", o.name))
		case c.Key == "retention.ms" && o.keep && kafka.Finite(v):
			log.Warn("kafka: the connector's own topic has a finite retention: records not redriven within it are deleted, and redrive cannot republish them",
				"role", o.role, "topic", o.name, "retention.ms", v,
				"fix", fmt.Sprintf("kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config retention.ms=-1", o.name))
		case c.Key == "retention.bytes" && o.keep && kafka.Finite(v):
			// The value is the topic's own or, without one, the broker's
			// log.retention.bytes: either deletes by size.
			log.Warn("kafka: the connector's own topic has a finite retention size: once a partition outgrows it, its oldest records are deleted, and redrive cannot republish them",
				"role", o.role, "topic", o.name, "retention.bytes", v,
				"fix", fmt.Sprintf("kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config retention.bytes=-1", o.name))
		}
	}
}
