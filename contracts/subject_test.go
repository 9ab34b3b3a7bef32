package contracts

import (
	"testing"
)

// TestSubjectStrategies: the subject of each strategy, and the events that
// have none.
func TestSubjectStrategies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s                Strategy
		topic, eventType string
		want             string
		wantErr          bool
	}{
		{StrategyTopicRecord, "outbox.event.order", "OrderCreated", "outbox.event.order-OrderCreated", false},
		{StrategyRecord, "outbox.event.order", "OrderCreated", "OrderCreated", false},
		{StrategyTopic, "outbox.event.order", "OrderCreated", "outbox.event.order-value", false},
		{StrategyTopic, "outbox.event.order", "", "outbox.event.order-value", false},
		{StrategyTopicRecord, "outbox.event.order", "", "", true},
		{StrategyRecord, "outbox.event.order", "", "", true},
		{"TopicRecordNameStrategy", "t", "e", "", true},
	} {
		got, err := tc.s.Subject(tc.topic, tc.eventType)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("%s.Subject(%q, %q) = %q, %v; want %q (error %v)", tc.s, tc.topic, tc.eventType, got, err, tc.want, tc.wantErr)
		}
	}
}
