package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Metadata answers what both producers (this package's and
// sink/exactlyonce's) ask of a topic before its records go: does it exist
// (creating it when allowed), and what record size it takes (Lookup). It
// reads the broker's settings once.
type Metadata struct {
	cl          *kgo.Client
	adm         *kadm.Client
	log         *slog.Logger
	autoCreate  bool  // kafka.auto_create_topics
	partitions  int32 // -1: the broker's default
	replication int16 // -1: the broker's default

	mu     sync.Mutex
	broker brokerInfo
}

// Creation is how the producers create event topics: kafka.auto_create_topics,
// kafka.topic_partitions and kafka.topic_replication_factor (0 or -1: the
// broker's default).
type Creation struct {
	Auto        bool
	Partitions  int32
	Replication int16
}

// NewMetadata asks through cl and creates topics as c says.
func NewMetadata(cl *kgo.Client, c Creation, log *slog.Logger) *Metadata {
	return &Metadata{cl: cl, adm: kadm.NewClient(cl), log: log, autoCreate: c.Auto,
		partitions: DefaultIfZero(c.Partitions), replication: DefaultIfZero(c.Replication)}
}

// DefaultIfZero is n, or -1 (the broker's default) for 0.
func DefaultIfZero[N int16 | int32](n N) N {
	if n == 0 {
		return -1
	}
	return n
}

// Replication is the replication factor of the topics it creates; -1: the
// broker's default.
func (m *Metadata) Replication() int16 { return m.replication }

// Lookup reports whether name exists, creating it when allowed, and, when
// it does, its max.message.bytes (maxMessageBytes; 0 if unknown). An error
// means the cluster could not be asked: ask again.
func (m *Metadata) Lookup(ctx context.Context, name string) (exists bool, limit int32, err error) {
	exists, err = m.existsOrCreate(ctx, name)
	if err == nil && exists {
		limit = m.maxMessageBytes(ctx, name)
	}
	return exists, limit, err
}

// existsOrCreate reports whether name exists, creating it when allowed.
func (m *Metadata) existsOrCreate(ctx context.Context, name string) (bool, error) {
	ok, err := m.exists(ctx, name)
	if err == nil && !ok && m.mayCreate(ctx) {
		ok, err = m.create(ctx, name)
	}
	return ok, err
}

// exists asks a broker for name's metadata, never auto-creating it.
func (m *Metadata) exists(ctx context.Context, name string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(name)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = false
	resp, err := req.RequestWith(ctx, m.cl)
	if err != nil {
		return false, fmt.Errorf("metadata: %w", err)
	}
	if len(resp.Brokers) > 0 {
		m.mu.Lock()
		m.broker.node = resp.Brokers[0].NodeID
		m.mu.Unlock()
	}
	for _, rt := range resp.Topics {
		if rt.Topic != nil && *rt.Topic == name {
			// Any other error (not authorized, say) is for producing to
			// report: the topic is not missing.
			return !errors.Is(kerr.ErrorForCode(rt.ErrorCode), kerr.UnknownTopicOrPartition), nil
		}
	}
	return false, fmt.Errorf("metadata: no answer for topic %s", name)
}

// create creates name with the configured partitions and replication factor.
// It reports false, without error, when the cluster refuses (a policy, a
// replication factor it cannot meet, no permission): the topic stays missing
// and its records wait for it.
func (m *Metadata) create(ctx context.Context, name string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := m.adm.CreateTopic(ctx, m.partitions, m.replication, nil, name)
	var ke *kerr.Error
	switch {
	case err == nil:
		m.log.Info("kafka: created topic", "topic", name, "partitions", resp.NumPartitions,
			"replication_factor", resp.ReplicationFactor,
			"requested", fmt.Sprintf("partitions %s, replication factor %s", orDefault(int(m.partitions)), orDefault(int(m.replication))))
		return true, nil
	case errors.Is(err, kerr.TopicAlreadyExists):
		return true, nil
	case errors.As(err, &ke):
		m.log.Error("kafka: cannot create topic; its records wait for it", "topic", name,
			"partitions", m.partitions, "replication_factor", m.replication, "err", err)
		return false, nil
	}
	return false, fmt.Errorf("create topic: %w", err)
}

func orDefault(n int) string {
	if n < 0 {
		return "broker default"
	}
	return strconv.Itoa(n)
}

// mayCreate: kafka.auto_create_topics is on and the broker does not forbid
// auto-creation, so the sink creates exactly the topics the broker's own
// auto-creation would have, with the stated settings.
func (m *Metadata) mayCreate(ctx context.Context) bool {
	if !m.autoCreate {
		return false
	}
	b := m.brokerConfig(ctx)
	return b.autoCreate == nil || *b.autoCreate
}

// brokerInfo holds broker settings read once.
type brokerInfo struct {
	node       int32 // a broker to ask
	read       time.Time
	ok         bool
	maxBytes   int32 // message.max.bytes, 0 if unknown
	autoCreate *bool // auto.create.topics.enable, nil if unknown
}

// brokerConfig reads a broker's message.max.bytes and
// auto.create.topics.enable, once, retrying at most once a minute.
func (m *Metadata) brokerConfig(ctx context.Context) brokerInfo {
	m.mu.Lock()
	b := m.broker
	m.mu.Unlock()
	if b.ok || time.Since(b.read) < time.Minute {
		return b
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	rcs, err := m.adm.DescribeBrokerConfigs(ctx, b.node)
	b.read = time.Now()
	if err == nil && len(rcs) == 1 && rcs[0].Err == nil {
		b.ok = true
		for _, c := range rcs[0].Configs {
			switch c.Key {
			case "message.max.bytes":
				b.maxBytes = parseLimit(c.MaybeValue())
			case "auto.create.topics.enable":
				v := c.MaybeValue() == "true"
				b.autoCreate = &v
			}
		}
	} else {
		m.log.Info("kafka: cannot read the broker's configuration; topic limits are learned from the topics only", "err", err)
	}
	m.mu.Lock()
	node := m.broker.node
	m.broker = b
	m.broker.node = node
	m.mu.Unlock()
	return b
}

// maxMessageBytes is name's max.message.bytes, or the broker's
// message.max.bytes if the topic's cannot be read, or 0.
func (m *Metadata) maxMessageBytes(ctx context.Context, name string) int32 {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	rcs, err := m.adm.DescribeTopicConfigs(ctx, name)
	if err == nil {
		if rc, err := rcs.On(name, nil); err == nil && rc.Err == nil {
			for _, c := range rc.Configs {
				if c.Key == "max.message.bytes" {
					if n := parseLimit(c.MaybeValue()); n > 0 {
						return n
					}
				}
			}
		}
	}
	return m.brokerConfig(ctx).maxBytes
}

func parseLimit(v string) int32 {
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n <= 0 {
		return 0
	}
	return int32(n)
}
