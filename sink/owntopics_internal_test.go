package sink

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestOwnTopicsListed: the dead-letter topic always, parking and state
// topics in quarantine mode, each with its stated settings.
func TestOwnTopicsListed(t *testing.T) {
	skip := ownTopics(Config{DLQTopic: "d"})
	if len(skip) != 1 || skip[0].name != "d" || skip[0].configs["retention.ms"] != "-1" || skip[0].configs["retention.bytes"] != "-1" || skip[0].keep {
		t.Fatalf("skip mode: %+v", skip)
	}
	q := ownTopics(Config{DLQTopic: "d", ParkingTopic: "p", QuarantineTopic: "q", TopicPartitions: 6})
	if len(q) != 3 {
		t.Fatalf("quarantine mode: %+v", q)
	}
	if p := q[1]; p.name != "p" || p.configs["retention.ms"] != "-1" || p.configs["retention.bytes"] != "-1" || !p.keep || p.partitions != 6 {
		t.Errorf("parking: %+v", p)
	}
	if s := q[2]; s.name != "q" || s.configs["cleanup.policy"] != "compact" || s.partitions != 1 || !s.compacted {
		t.Errorf("state: %+v", s)
	}
	want := "kafka-topics.sh --bootstrap-server b1,b2 --create --topic p --partitions 6 --replication-factor 3 --config retention.bytes=-1 --config retention.ms=-1"
	if got := q[1].createCommand([]string{"b1", "b2"}, 3); got != want {
		t.Errorf("command %q, want %q", got, want)
	}
}

// TestCheckOwnTopicRetention: a finite retention.ms or retention.bytes on
// a topic whose records are kept (its own value, or the broker's default
// showing through) is warned about with the command that fixes it; -1, or
// a topic not kept, is not.
func TestCheckOwnTopicRetention(t *testing.T) {
	fixMs := "kafka-configs.sh --alter --entity-type topics --entity-name p --add-config retention.ms=-1"
	fixBytes := "kafka-configs.sh --alter --entity-type topics --entity-name p --add-config retention.bytes=-1"
	topic := kmsg.ConfigSourceDynamicTopicConfig
	broker := kmsg.ConfigSourceStaticBrokerConfig
	cases := []struct {
		name    string
		keep    bool
		configs []kadm.Config
		want    [][]string // the parts of each warning, in order
	}{
		{"unlimited", true, []kadm.Config{cfg("retention.ms", "-1", topic), cfg("retention.bytes", "-1", broker)}, nil},
		{"finite ms", true, []kadm.Config{cfg("retention.ms", "3600000", topic), cfg("retention.bytes", "-1", broker)},
			[][]string{{"finite retention: records not redriven within it are deleted", "retention.ms=3600000", fixMs}}},
		{"finite bytes on the topic", true, []kadm.Config{cfg("retention.ms", "-1", topic), cfg("retention.bytes", "1048576", topic)},
			[][]string{{"finite retention size: once a partition outgrows it, its oldest records are deleted", "retention.bytes=1048576", fixBytes}}},
		{"finite bytes of the broker", true, []kadm.Config{cfg("retention.ms", "-1", topic), cfg("retention.bytes", "1073741824", broker)},
			[][]string{{"finite retention size", "retention.bytes=1073741824", fixBytes}}},
		{"both finite", true, []kadm.Config{cfg("retention.ms", "1", topic), cfg("retention.bytes", "0", topic)},
			[][]string{{"finite retention:", "retention.ms=1", fixMs}, {"finite retention size", "retention.bytes=0", fixBytes}}},
		{"not kept", false, []kadm.Config{cfg("retention.ms", "3600000", topic), cfg("retention.bytes", "1048576", topic)}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			warnOwnTopic(ownTopic{name: "p", role: "parking", keep: c.keep}, c.configs, log)
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if buf.Len() == 0 {
				lines = nil
			}
			if len(lines) != len(c.want) {
				t.Fatalf("%d warnings, want %d:\n%s", len(lines), len(c.want), buf.String())
			}
			for i, parts := range c.want {
				for _, p := range append([]string{"level=WARN", "topic=p", "role=parking"}, parts...) {
					if !strings.Contains(lines[i], p) {
						t.Errorf("warning %d does not say %q:\n%s", i, p, lines[i])
					}
				}
			}
		})
	}
}

func cfg(key, value string, source kmsg.ConfigSource) kadm.Config {
	return kadm.Config{Key: key, Value: kadm.StringPtr(value), Source: source}
}
