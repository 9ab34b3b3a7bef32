package main

// Retention's cost on the write path (issue 28): the writers' INSERT and
// COMMIT times with outbox.retention deleting delivered rows during the run,
// beside the default run at the same rate.

const (
	retentionPrefix   = "outbox-cdc-retention"
	rowsDeletedMetric = "outbox_cdc_outbox_rows_deleted_total"
)

// renderRetention writes, per rate that has a retention run, the write
// latency of the default run and of each retention run.
func renderRetention(w func(string, ...any), r *Results) {
	var rows []SteadyResult
	for _, s := range r.Steady {
		if s.Retention == "" {
			continue
		}
		if d := findSteady(r, defaultSystem, s.OfferedRate); d != nil {
			rows = append(rows, *d)
		}
		rows = append(rows, s)
	}
	if len(rows) == 0 {
		return
	}
	w("## Retention's cost on the write path\n\n")
	w("The application's side: each writer's INSERT and COMMIT (one autocommit round trip) per event, with the defaults " +
		"and with `outbox.retention` deleting the delivered rows during the run (`outbox.retention_interval` 1s, the " +
		"default batches of 5,000 at a 10%% duty cycle).\n\n")
	w("| offered/s | system | achieved/s | write p50 / p99 / p99.9 / max (ms) | rows deleted | commit-to-consume p99 (ms) |\n|---|---|---|---|---|---|\n")
	for _, s := range rows {
		c := s.Write
		w("| %s | %s | %s | %s / %s / %s / %s | %s | %s |\n", thousands(s.OfferedRate), s.label(), thousands(int(s.AchievedRate)),
			ms(c.P50Ms), ms(c.P99Ms), ms(c.P999Ms), ms(c.MaxMs), thousands(int(s.RowsDeleted)), ms(s.CommitToConsume.P99Ms))
	}
	w("\n")
}
