package sink

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
)

// finite reports whether a retention.ms or retention.bytes value deletes
// records (-1, or none given: never).
func finite(v string) bool {
	n, err := strconv.ParseInt(v, 10, 64)
	return err == nil && n >= 0
}

// compacts reports whether a cleanup.policy value compacts: the value is
// a comma-separated list, and "compact,delete" compacts (and deletes too).
func compacts(policy string) bool { return policyHas(policy, "compact") }

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
// partition outgrows it). It returns the policy as a problem would state it. The one
// definition: the state topic, the positions topic and EnsureOwnTopics
// check with it.
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
	if !compacts(policy) {
		return policy, false
	}
	switch {
	case policyHas(policy, "delete") && finite(retention):
		return fmt.Sprintf("%s with retention.ms %s", policy, retention), false
	case policyHas(policy, "delete") && finite(bytes):
		return fmt.Sprintf("%s with retention.bytes %s", policy, bytes), false
	}
	return policy, true
}
