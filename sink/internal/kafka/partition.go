package kafka

import "github.com/twmb/franz-go/pkg/kgo"

// NewPartitioner is the producers' partitioner: murmur2 on the key (the
// Java client's hash) unless the record has its own partition.
func NewPartitioner() kgo.Partitioner { return partitioner{kgo.StickyKeyPartitioner(nil)} }

// partitioner sends a record whose Partition is set (≥ 0) there and leaves
// the others (Partition -1, set by Produce) to the key partitioner. franz-go
// writes the chosen partition into the record, so a record sent again (a
// repair, a dead letter's next attempt) keeps the partition it had.
type partitioner struct{ byKey kgo.Partitioner }

func (p partitioner) ForTopic(topic string) kgo.TopicPartitioner {
	return topicPartitioner{p.byKey.ForTopic(topic)}
}

type topicPartitioner struct{ kgo.TopicPartitioner }

func (t topicPartitioner) RequiresConsistency(r *kgo.Record) bool {
	return r.Partition >= 0 || t.TopicPartitioner.RequiresConsistency(r)
}

// Partition returns r's own partition when set; one beyond the topic's
// partitions fails the record (franz-go checks the choice), as Kafka
// Connect's producer fails Debezium's task.
func (t topicPartitioner) Partition(r *kgo.Record, n int) int {
	if r.Partition >= 0 {
		return int(r.Partition)
	}
	return t.TopicPartitioner.Partition(r, n)
}

// OnNewBatch passes the sticky partitioner's batch hint on.
func (t topicPartitioner) OnNewBatch() {
	if o, ok := t.TopicPartitioner.(kgo.TopicPartitionerOnNewBatch); ok {
		o.OnNewBatch()
	}
}
