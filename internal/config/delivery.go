package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// kafka.delivery values.
const (
	// DeliveryAtLeastOnce is the idempotent producer: a crash can publish
	// the transactions after the confirmed position again.
	DeliveryAtLeastOnce = "at_least_once"
	// DeliveryExactlyOnce is the transactional producer (sink/exactlyonce): whole
	// PostgreSQL transactions per Kafka transaction, the position committed
	// in it.
	DeliveryExactlyOnce = "exactly_once"
)

// ExactlyOnce reports kafka.delivery exactly_once.
func (k Kafka) ExactlyOnce() bool { return k.Delivery == DeliveryExactlyOnce }

func (v *validator) delivery(k Kafka, d DLQ, s Snapshot) {
	v.oneOf("kafka.delivery", k.Delivery, []string{DeliveryAtLeastOnce, DeliveryExactlyOnce})
	if !k.ExactlyOnce() {
		return
	}
	// Below 1ms every transaction is its own Kafka transaction for nothing;
	// above a minute the broker's transaction timeout would abort it.
	v.durationRange("kafka.transaction_interval", k.TransactionInterval, time.Millisecond, time.Minute,
		"how long PostgreSQL transactions are grouped into one Kafka transaction")
	// Kafka's own bounds: at least a second, at most the broker's default
	// transaction.max.timeout.ms (a broker set higher accepts more).
	v.durationRange("kafka.transaction_timeout", k.TransactionTimeout, time.Second, 15*time.Minute,
		"how long the broker lets one of the connector's Kafka transactions stay open")
	if k.TransactionTimeout >= time.Second && k.TransactionInterval >= k.TransactionTimeout {
		v.add("kafka.transaction_interval", k.TransactionInterval.String(), "not shorter than kafka.transaction_timeout",
			"keep it well below the timeout (the default 5ms)")
	}
	if k.PositionsTopic == k.DLQTopic || (k.PositionsTopic == k.ParkingTopic || k.PositionsTopic == k.QuarantineTopic) && d.Mode == DLQQuarantine {
		v.add("kafka.positions_topic", k.PositionsTopic, "same as the dead-letter, parking or quarantine topic",
			"choose a topic of its own, such as outbox-cdc.positions")
		return
	}
	for _, p := range (router.Config{TopicTemplate: k.Topic, Topics: k.Topics, DLQTopic: k.PositionsTopic,
		TopicRegex: k.TopicRegex, TopicReplacement: k.TopicReplacement}).Check() {
		if p.Key == "kafka.dlq_topic" {
			v.add("kafka.positions_topic", p.Value, p.Reason, "choose a positions topic no event can be published to")
		}
	}
}

// txnHeaders refuses, with exactly_once, a header column named like the
// headers of a transaction committed in parts (wire.HeaderTxn,
// wire.HeaderTxnPart): its events would carry two, and a consumer reads the
// first.
func (v *validator) txnHeaders(c *Config) {
	if !c.Kafka.ExactlyOnce() {
		return
	}
	check := func(prefix string, cols []string) {
		for i, h := range cols {
			if h == wire.HeaderTxn || h == wire.HeaderTxnPart {
				v.add(fmt.Sprintf("%s[%d]", prefix, i), h, "with kafka.delivery exactly_once the events of a transaction committed in parts "+
					"carry the header "+h+"; a column with this name would give a second one", "rename the column, or remove it from the list")
			}
		}
	}
	check("outbox.header_columns", c.Outbox.HeaderColumns)
	for i, t := range c.Outbox.Tables {
		check(fmt.Sprintf("outbox.tables[%d].header_columns", i), t.HeaderColumns)
	}
}

// snapshotIDs refuses, with exactly_once and snapshot.mode pending, plain
// records without an id header (outbox.standard_headers without id): a
// snapshot taken again after a crash finds what the interrupted one
// committed by its records' ids (pipeline/readback.go), and would publish
// every row again.
func (v *validator) snapshotIDs(c *Config) {
	if !c.Kafka.ExactlyOnce() || c.Snapshot.Mode != "pending" {
		return
	}
	for i, tc := range c.PerTable() {
		ob := tc.Outbox
		if ob.StandardHeaders == nil || slices.Contains(ob.StandardHeaders, "id") || tc.Kafka.Format != router.FormatPlain {
			continue
		}
		key := "outbox.standard_headers"
		if len(c.Outbox.Tables) > 0 && c.Outbox.Tables[i].StandardHeaders != nil {
			key = fmt.Sprintf("outbox.tables[%d].standard_headers", i)
		}
		v.add(key, strings.Join(ob.StandardHeaders, ","), "without id, with kafka.delivery exactly_once and snapshot.mode pending: "+
			"a snapshot taken again after a crash finds the rows already in Kafka by their id header, and would publish them all again",
			"keep id in the list, or set snapshot.mode: none")
		return
	}
}
