package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Finite reports whether a retention.ms or retention.bytes value deletes
// records (-1, or none given: never).
func Finite(v string) bool {
	n, err := strconv.ParseInt(v, 10, 64)
	return err == nil && n >= 0
}

// Compacts reports whether a cleanup.policy value compacts: the value is
// a comma-separated list, and "compact,delete" compacts (and deletes too).
func Compacts(policy string) bool { return policyHas(policy, "compact") }

func policyHas(policy, want string) bool {
	for p := range strings.SplitSeq(policy, ",") {
		if strings.EqualFold(strings.TrimSpace(p), want) {
			return true
		}
	}
	return false
}

// KeepsLastPerKey reports whether a topic with these settings keeps each
// key's last record for ever, as the quarantine state and positions topics
// must: it compacts, and it does not also delete by time ("compact,delete"
// with a finite retention.ms deletes a quarantine or a position older than
// that, and with a finite retention.bytes the oldest segments once a
// partition outgrows it). It returns the policy as a problem would state
// it. The one definition: EnsureTopic checks every own topic with it.
func KeepsLastPerKey(configs []kadm.Config) (policy string, ok bool) {
	retention, bytes := "", ""
	for _, c := range configs {
		switch c.Key {
		case "cleanup.policy":
			policy = c.MaybeValue()
		case "retention.ms":
			retention = c.MaybeValue()
		case "retention.bytes":
			bytes = c.MaybeValue()
		}
	}
	if !Compacts(policy) {
		return policy, false
	}
	switch {
	case policyHas(policy, "delete") && Finite(retention):
		return fmt.Sprintf("%s with retention.ms %s", policy, retention), false
	case policyHas(policy, "delete") && Finite(bytes):
		return fmt.Sprintf("%s with retention.bytes %s", policy, bytes), false
	}
	return policy, true
}

// TopicSpec is one of the connector's own topics (dead-letter, parking,
// quarantine state, positions): how it is created, and what an existing
// one must keep.
type TopicSpec struct {
	Name string
	// Label names the topic in errors: "describe <Label>: …", "create <Label>: …".
	Label       string
	Partitions  int32 // -1: the broker's default
	Replication int16 // -1: the broker's default
	Configs     map[string]string
	// KeepLast: the topic must keep each key's last record for ever
	// (KeepsLastPerKey); an existing one that does not is a *NotKeptError.
	KeepLast bool
	// Validate asks whether the cluster would create a missing topic,
	// creating nothing.
	Validate bool
	// MayBeUnreadable: an existing topic whose settings the cluster will not
	// describe (not authorized, say) is Unreadable, not an error.
	MayBeUnreadable bool
}

// Found is what EnsureTopic found.
type Found int

const (
	// Exists: the topic exists; Topic.Configs are its settings.
	Exists Found = iota
	// Created: it was missing and is created now (Validate: the cluster
	// would create it).
	Created
	// CreatedMeanwhile: it was missing and another client created it.
	CreatedMeanwhile
	// Unreadable: its settings could not be read (MayBeUnreadable);
	// Topic.Err is the cluster's answer.
	Unreadable
)

// Topic is what EnsureTopic found of a topic.
type Topic struct {
	Found       Found
	Configs     []kadm.Config // Exists: the topic's settings
	Partitions  int32         // Created: as the cluster created it
	Replication int16
	Err         error // Unreadable: why
}

// TopicError is a describe or a create of an own topic that failed.
type TopicError struct {
	Op, Label string // "describe" or "create"; TopicSpec.Label
	Err       error  // the cluster's answer
}

func (e *TopicError) Error() string { return e.Op + " " + e.Label + ": " + e.Err.Error() }
func (e *TopicError) Unwrap() error { return e.Err }

// Refused reports whether the cluster answered the request with an error
// of its own (a policy, a replication factor it cannot meet, no
// permission), not whether it could be asked.
func (e *TopicError) Refused() bool {
	var ke *kerr.Error
	return errors.As(e.Err, &ke)
}

// NotKeptError is an existing topic that must keep each key's last record
// (TopicSpec.KeepLast) and would delete it; Policy as KeepsLastPerKey states it.
type NotKeptError struct{ Topic, Policy string }

func (e *NotKeptError) Error() string {
	return fmt.Sprintf("topic %s has cleanup.policy %q, not compact", e.Topic, e.Policy)
}

// EnsureTopic is the one routine for the connector's own topics: it reads
// spec's topic's settings and checks them (KeepLast), or creates the
// missing topic as spec says (Validate: asks whether the cluster would).
// It returns a *TopicError when the cluster cannot be asked or refuses, a
// *NotKeptError for settings that lose what must be kept; the caller
// words them.
func EnsureTopic(ctx context.Context, adm *kadm.Client, spec TopicSpec) (Topic, error) {
	rcs, err := adm.DescribeTopicConfigs(ctx, spec.Name)
	if err != nil {
		return Topic{}, &TopicError{Op: "describe", Label: spec.Label, Err: err}
	}
	rc, err := rcs.On(spec.Name, nil)
	if err == nil {
		err = rc.Err
	}
	switch {
	case err == nil:
		if policy, ok := KeepsLastPerKey(rc.Configs); spec.KeepLast && !ok {
			return Topic{}, &NotKeptError{Topic: spec.Name, Policy: policy}
		}
		return Topic{Found: Exists, Configs: rc.Configs}, nil
	case !errors.Is(err, kerr.UnknownTopicOrPartition):
		if te := (&TopicError{Err: err}); spec.MayBeUnreadable && te.Refused() {
			return Topic{Found: Unreadable, Err: err}, nil
		}
		return Topic{}, &TopicError{Op: "describe", Label: spec.Label, Err: err}
	}
	configs := make(map[string]*string, len(spec.Configs))
	for k, v := range spec.Configs {
		configs[k] = kadm.StringPtr(v)
	}
	var resp kadm.CreateTopicResponses
	if spec.Validate {
		resp, err = adm.ValidateCreateTopics(ctx, spec.Partitions, spec.Replication, configs, spec.Name)
	} else {
		resp, err = adm.CreateTopics(ctx, spec.Partitions, spec.Replication, configs, spec.Name)
	}
	if err == nil {
		err = resp.Error()
	}
	switch {
	case err == nil:
		r := resp[spec.Name]
		return Topic{Found: Created, Partitions: r.NumPartitions, Replication: r.ReplicationFactor}, nil
	case errors.Is(err, kerr.TopicAlreadyExists):
		return Topic{Found: CreatedMeanwhile}, nil
	}
	return Topic{}, &TopicError{Op: "create", Label: spec.Label, Err: err}
}
