package contracts

import "testing"

// TestMayBeOurs: a load fetches a subject only if one of the writer's
// events can name it under the strategy, topics with dashes included.
func TestMayBeOurs(t *testing.T) {
	fixed := map[string]string{"customer": "crm-customers"}
	for _, tc := range []struct {
		strategy Strategy
		template string
		subject  string
		want     bool
	}{
		{StrategyTopicRecord, "", "outbox.event.order-OrderCreated", true},
		{StrategyTopicRecord, "", "outbox.event.order-with-dash-Type", true},
		{StrategyTopicRecord, "", "outbox.event.-Type", false}, // empty aggregate type
		{StrategyTopicRecord, "", "crm-customers-CustomerRegistered", true},
		{StrategyTopicRecord, "", "crm-other-Thing", false},
		{StrategyTopicRecord, "", "orders-value", false},
		{StrategyTopicRecord, "{aggregate_type}.v1", "order.v1-OrderCreated", true},
		{StrategyTopicRecord, "{aggregate_type}.v1", "order.v2-OrderCreated", false},
		{StrategyTopicRecord, "all-events", "all-events-OrderCreated", true},
		{StrategyTopicRecord, "all-events", "all-OrderCreated", false},
		{StrategyTopic, "", "outbox.event.order-value", true},
		{StrategyTopic, "", "outbox.event.order-OrderCreated", false},
		{StrategyRecord, "", "anything at all", true},
	} {
		n, err := newSubjects(tc.strategy, tc.template, fixed)
		if err != nil {
			t.Fatal(err)
		}
		if got := n.mayBeOurs(tc.subject); got != tc.want {
			t.Errorf("%s %q: mayBeOurs(%q) = %v, want %v", tc.strategy, tc.template, tc.subject, got, tc.want)
		}
	}
}
