package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The connector's walsender, sampled during a steady run: how much WAL it
// has not sent yet, how much it sent that the connector has not confirmed,
// and what it waits on. The wait event tells whose the delay is (PostgreSQL
// docs, "Wait Event Types", Table 27.5/27.8): no wait event is a walsender
// on the CPU (decoding, sending); Client:WalSenderWriteData is one whose
// socket is full, waiting for the connector to read; Activity:
// WalSenderMain and IO:WALRead… are its own loop and WAL reads;
// Activity:WalSenderWaitForWAL is one with nothing to send.

// walEvery is the sampling period: 20 readings a second cost one light query
// each and still see a wave of 100 ms.
const walEvery = 50 * time.Millisecond

// walBehindBytes: WAL not yet sent above this counts as "behind" (at
// 10,000 events/s the outbox writes about 4 MB of WAL a second, so 256 KB is
// some 60 ms of it).
const walBehindBytes = 256 << 10

// walSample is one reading.
type walSample struct {
	At          time.Time
	NotSent     int64  // pg_current_wal_lsn() - sent_lsn
	Unconfirmed int64  // sent_lsn - flush_lsn (the connector's confirmed position)
	Wait        string // wait_event_type:wait_event, "CPU" when none
}

// WALSenderStats summarizes the samples of one run.
type WALSenderStats struct {
	Samples       int     `json:"samples"`
	NotSentP50KB  float64 `json:"not_sent_p50_kb"`
	NotSentP99KB  float64 `json:"not_sent_p99_kb"`
	NotSentMaxKB  float64 `json:"not_sent_max_kb"`
	UnconfP50KB   float64 `json:"unconfirmed_p50_kb"`
	UnconfP99KB   float64 `json:"unconfirmed_p99_kb"`
	UnconfMaxKB   float64 `json:"unconfirmed_max_kb"`
	BehindShare   float64 `json:"behind_share"`      // samples with more than walBehindBytes not sent
	BehindSpans   int     `json:"behind_spans"`      // runs of consecutive such samples
	LongestBehind float64 `json:"longest_behind_ms"` // the longest run
	// Waits is the share of samples in each wait (top ones), and, of the
	// samples taken while behind, the share in each.
	Waits       map[string]float64 `json:"waits"`
	WaitsBehind map[string]float64 `json:"waits_behind,omitempty"`
}

// walSampler reads pg_stat_replication for one slot until stopped.
type walSampler struct {
	cancel  context.CancelFunc
	done    chan struct{}
	samples []walSample // written by the sampling goroutine until done
	err     error
}

const walQuery = `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), r.sent_lsn)::bigint,
       coalesce(pg_wal_lsn_diff(r.sent_lsn, r.flush_lsn), 0)::bigint,
       coalesce(a.wait_event_type || ':' || a.wait_event, 'CPU')
  FROM pg_replication_slots s
  JOIN pg_stat_replication r ON r.pid = s.active_pid
  JOIN pg_stat_activity a ON a.pid = s.active_pid
 WHERE s.slot_name = $1`

// startWALSampler samples slot's walsender every walEvery on a connection
// of its own, until stop.
func startWALSampler(ctx context.Context, dsn, slot string) (*walSampler, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("walsender sampler: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &walSampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer conn.Close(context.WithoutCancel(ctx))
		tick := time.NewTicker(walEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var x walSample
			err := conn.QueryRow(ctx, walQuery, slot).Scan(&x.NotSent, &x.Unconfirmed, &x.Wait)
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, pgx.ErrNoRows):
				continue // between connections: nothing to read
			case err != nil:
				s.err = fmt.Errorf("walsender sampler: %w", err)
				return
			}
			x.At = time.Now()
			s.samples = append(s.samples, x)
		}
	}()
	return s, nil
}

// stop ends the sampling and summarizes it.
func (s *walSampler) stop() (*WALSenderStats, error) {
	s.cancel()
	<-s.done
	if s.err != nil {
		return nil, s.err
	}
	return summarizeWAL(s.samples), nil
}

// summarizeWAL is the run's summary of its samples.
func summarizeWAL(samples []walSample) *WALSenderStats {
	st := &WALSenderStats{Samples: len(samples), Waits: map[string]float64{}}
	if len(samples) == 0 {
		return st
	}
	notSent, unconf := make([]float64, len(samples)), make([]float64, len(samples))
	waits, behindWaits := map[string]int{}, map[string]int{}
	behind := 0
	var spanStart time.Time
	var longest time.Duration
	for i, x := range samples {
		notSent[i], unconf[i] = float64(x.NotSent)/1024, float64(x.Unconfirmed)/1024
		waits[x.Wait]++
		if x.NotSent <= walBehindBytes {
			spanStart = time.Time{}
			continue
		}
		behind++
		behindWaits[x.Wait]++
		if spanStart.IsZero() {
			spanStart = x.At
			st.BehindSpans++
		}
		// A span lasts from its first sample to its last (a lone sample: 0).
		longest = max(longest, x.At.Sub(spanStart))
	}
	ns, uc := percentiles(notSent), percentiles(unconf) // KB in the Ms fields: the same ranks
	st.NotSentP50KB, st.NotSentP99KB, st.NotSentMaxKB = round(ns.P50Ms, 1), round(ns.P99Ms, 1), round(ns.MaxMs, 1)
	st.UnconfP50KB, st.UnconfP99KB, st.UnconfMaxKB = round(uc.P50Ms, 1), round(uc.P99Ms, 1), round(uc.MaxMs, 1)
	st.BehindShare = round(float64(behind)/float64(len(samples)), 3)
	st.LongestBehind = float64(longest.Milliseconds())
	st.Waits = shares(waits, len(samples))
	if behind > 0 {
		st.WaitsBehind = shares(behindWaits, behind)
	}
	return st
}

// shares turns counts into fractions of n, rounded.
func shares(counts map[string]int, n int) map[string]float64 {
	out := make(map[string]float64, len(counts))
	for k, c := range counts {
		out[k] = round(float64(c)/float64(n), 3)
	}
	return out
}

// waitsText is "CPU 61%, Client:WalSenderWriteData 30%, …", largest first.
func waitsText(w map[string]float64) string {
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if w[keys[i]] != w[keys[j]] {
			return w[keys[i]] > w[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.0f%%", k, 100*w[k])
	}
	return strings.Join(parts, ", ")
}
