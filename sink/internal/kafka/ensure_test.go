package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestEnsureTopic: the one routine behind every own topic creates a
// missing topic (or, Validate, only asks), reads an existing one's
// settings, and refuses one that must keep each key's last record and
// would not.
func TestEnsureTopic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "deleting"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	compact := map[string]string{"cleanup.policy": "compact"}

	got, err := EnsureTopic(ctx, adm, TopicSpec{Name: "would", Label: "x", Partitions: 1, Replication: -1, Configs: compact, Validate: true})
	if err != nil || got.Found != Created {
		t.Fatalf("Validate of a missing topic = %+v, %v; want Created", got, err)
	}
	got, err = EnsureTopic(ctx, adm, TopicSpec{Name: "state", Label: "x", Partitions: 1, Replication: -1, Configs: compact, KeepLast: true})
	if err != nil || got.Found != Created || got.Partitions != 1 {
		t.Fatalf("create = %+v, %v; want Created with 1 partition", got, err)
	}
	got, err = EnsureTopic(ctx, adm, TopicSpec{Name: "state", Label: "x", Partitions: 1, Replication: -1, Configs: compact, KeepLast: true})
	if err != nil || got.Found != Exists {
		t.Fatalf("existing compacted topic = %+v, %v; want Exists", got, err)
	}
	_, err = EnsureTopic(ctx, adm, TopicSpec{Name: "deleting", Label: "x", KeepLast: true})
	var nk *NotKeptError
	if !errors.As(err, &nk) || nk.Topic != "deleting" {
		t.Fatalf("existing topic that deletes = %v, want a NotKeptError", err)
	}
	got, err = EnsureTopic(ctx, adm, TopicSpec{Name: "deleting", Label: "x"})
	if err != nil || got.Found != Exists || len(got.Configs) == 0 {
		t.Fatalf("existing topic = %+v, %v; want Exists with its settings", got, err)
	}
}
