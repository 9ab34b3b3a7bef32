// Package kafka is the Kafka kernel the three producers of the connector
// share (sink's idempotent one, sink/exactlyonce's transactional one and
// sink/quarantine's state and redrive clients): the topic metadata, an
// event's size and its dead-letter copies, one EnsureTopic for every topic
// of the connector's own, the error classes (transactional ones too), the
// partitioner, headers and a backoff. It holds no producer of its own.
package kafka
