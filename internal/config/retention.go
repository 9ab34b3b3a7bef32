package config

import (
	"fmt"
	"strconv"
	"time"
)

// The pacing defaults of outbox.retention: the seeds' batches of 5000
// (DELETE … LIMIT 5000), deleting at most a tenth of the time, a round a minute.
const (
	DefaultRetentionBatchSize = 5000
	DefaultRetentionDutyCycle = 0.1
	DefaultRetentionInterval  = time.Minute
	// Daily partitions, three made ahead (docs/guide.md).
	DefaultPartitionWidth  = 24 * time.Hour
	DefaultPartitionsAhead = 3
	// shortRetention is where the start warns: verify cannot look further back.
	shortRetention = time.Hour
)

func (v *validator) retention(ob Outbox, store string) {
	if ob.Retention < 0 {
		v.add("outbox.retention", ob.Retention.String(), "must not be negative", "use a duration such as 48h, or 0 to keep every row")
	}
	if ob.Retention == 0 {
		return
	}
	// A gap found by one run is held in the checkpoint; without one, the
	// next run would not know to keep the rows verify --repair must read.
	if store == "none" {
		v.add("outbox.retention", ob.Retention.String(), "needs a checkpoint store: a gap the connector finds is remembered there, and holds retention back until it is repaired",
			"set checkpoint.store: table (or file), or outbox.retention: 0")
	}
	if ob.RetentionBatchSize < 1 || ob.RetentionBatchSize > 100_000 {
		v.add("outbox.retention_batch_size", strconv.Itoa(ob.RetentionBatchSize), "must be between 1 and 100000 (rows per DELETE, each its own transaction)",
			fmt.Sprintf("use %d", DefaultRetentionBatchSize))
	}
	if !(ob.RetentionDutyCycle > 0 && ob.RetentionDutyCycle <= 1) {
		v.add("outbox.retention_duty_cycle", strconv.FormatFloat(ob.RetentionDutyCycle, 'g', -1, 64),
			"must be above 0 and at most 1 (the share of the time spent deleting)", fmt.Sprintf("use %g", DefaultRetentionDutyCycle))
	}
	v.durationRange("outbox.retention_interval", ob.RetentionInterval, 100*time.Millisecond, 24*time.Hour, "how often a round starts")
	v.durationRange("outbox.partition_width", ob.PartitionWidth, time.Second, 31*24*time.Hour, "the range of each partition made")
	if ob.PartitionsAhead < 1 || ob.PartitionsAhead > 1000 {
		v.add("outbox.partitions_ahead", strconv.Itoa(ob.PartitionsAhead), "must be between 1 and 1000 (partitions made past the current one)",
			fmt.Sprintf("use %d", DefaultPartitionsAhead))
	}
}

// retentionWarnings: a retention under an hour is allowed (tests, demos),
// but verify can then look back no further than it.
func (c *Config) retentionWarnings() []FieldError {
	r := c.Outbox.Retention
	if r <= 0 || r >= shortRetention {
		return nil
	}
	return []FieldError{{Key: "outbox.retention", Problem: fmt.Sprintf(
		"rows are deleted %s after they were created and delivered, so verify (--since) can check and repair only the last %s; keep rows for longer than it takes to notice an incident (24h-72h is common)", r, r)}}
}
