package kafka

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
)

// TestCompactionRule: cleanup.policy is a comma-separated list, and a topic
// keeps each key's last record for ever only when it compacts without also
// deleting by time.
func TestCompactionRule(t *testing.T) {
	cases := []struct {
		policy, retention string // "" retention: not described
		compacts, keeps   bool
	}{
		{"compact", "", true, true},
		{"compact", "604800000", true, true}, // retention.ms does not apply without delete
		{"delete", "", false, false},
		{"delete", "-1", false, false},
		{"compact,delete", "604800000", true, false},
		{"compact,delete", "-1", true, true},
		{"delete,compact", "-1", true, true},
		{"delete, compact", "", true, true},
		{"COMPACT", "", true, true},
		{"", "", false, false},
		{"uncompacted", "", false, false}, // not a list element
	}
	for _, c := range cases {
		configs := []kadm.Config{{Key: "cleanup.policy", Value: kadm.StringPtr(c.policy)}}
		if c.retention != "" {
			configs = append(configs, kadm.Config{Key: "retention.ms", Value: kadm.StringPtr(c.retention)})
		}
		if got := Compacts(c.policy); got != c.compacts {
			t.Errorf("compacts(%q) = %v, want %v", c.policy, got, c.compacts)
		}
		if _, got := KeepsLastPerKey(configs); got != c.keeps {
			t.Errorf("KeepsLastPerKey(%q, retention.ms %q) = %v, want %v", c.policy, c.retention, got, c.keeps)
		}
	}
}

// TestCompactionRuleBytes: "compact,delete" with a finite retention.bytes
// deletes the oldest segments once a partition outgrows it, keys with them.
func TestCompactionRuleBytes(t *testing.T) {
	for _, c := range []struct {
		policy, bytes string
		keeps         bool
	}{
		{"compact,delete", "1048576", false},
		{"compact,delete", "-1", true},
		{"compact", "1048576", true}, // retention.bytes does not apply without delete
	} {
		configs := []kadm.Config{{Key: "cleanup.policy", Value: kadm.StringPtr(c.policy)},
			{Key: "retention.ms", Value: kadm.StringPtr("-1")}, {Key: "retention.bytes", Value: kadm.StringPtr(c.bytes)}}
		if why, got := KeepsLastPerKey(configs); got != c.keeps {
			t.Errorf("KeepsLastPerKey(%q, retention.bytes %q) = %v (%s), want %v", c.policy, c.bytes, got, why, c.keeps)
		}
	}
}
