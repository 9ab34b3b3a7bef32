package sink

import "testing"

// TestOwnTopicsListed: the dead-letter topic always, parking and state
// topics in quarantine mode, each with its stated settings.
func TestOwnTopicsListed(t *testing.T) {
	skip := ownTopics(Config{DLQTopic: "d"})
	if len(skip) != 1 || skip[0].name != "d" || skip[0].configs["retention.ms"] != "-1" || skip[0].keep {
		t.Fatalf("skip mode: %+v", skip)
	}
	q := ownTopics(Config{DLQTopic: "d", ParkingTopic: "p", QuarantineTopic: "q", TopicPartitions: 6})
	if len(q) != 3 {
		t.Fatalf("quarantine mode: %+v", q)
	}
	if p := q[1]; p.name != "p" || p.configs["retention.ms"] != "-1" || !p.keep || p.partitions != 6 {
		t.Errorf("parking: %+v", p)
	}
	if s := q[2]; s.name != "q" || s.configs["cleanup.policy"] != "compact" || s.partitions != 1 || !s.compacted {
		t.Errorf("state: %+v", s)
	}
	want := "kafka-topics.sh --bootstrap-server b1,b2 --create --topic p --partitions 6 --replication-factor 3 --config retention.ms=-1"
	if got := q[1].createCommand([]string{"b1", "b2"}, 3); got != want {
		t.Errorf("command %q, want %q", got, want)
	}
}
