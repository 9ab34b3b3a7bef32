package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// The floors of a steady rate: what the two halves of the connector's path
// cost at least, measured in the same run at the same rate. The WAL side's
// is pg_recvlogical streaming a slot to /dev/null while the same writers
// insert (walsender + client CPU); the broker side's is a bare franz-go
// producer loop producing the same records with the connector's client
// settings (broker CPU), with no PostgreSQL at all.

const (
	floorRecv     = "pg_recvlogical"
	floorProducer = "producer-floor"
)

// runRecvFloor streams a fresh slot with pg_recvlogical during a paced load
// and accounts the walsender's and pg_recvlogical's CPU until the walsender
// has sent the last event.
func runRecvFloor(ctx context.Context, e *env, opts options, rate, rows int, log *slog.Logger) (*SteadyResult, error) {
	ctx, cancel := context.WithTimeout(ctx, opts.Duration+opts.SettleWait+time.Minute)
	defer cancel()
	aggType := fmt.Sprintf("steady_recv_%d", rate)
	res := &SteadyResult{System: floorRecv, OfferedRate: rate}
	if rows > 1 {
		aggType += fmt.Sprintf("_tx%d", rows)
		res.TxRows = rows
	}
	slot := "recv_" + aggType
	log = log.With("scenario", "steady", "system", res.label(), "rate", rate)
	defer func() {
		e.dropSlots(ctx, slot)
		if err := e.exec(context.WithoutCancel(ctx), "TRUNCATE "+outboxTable); err != nil {
			log.Warn("truncate", "err", err)
		}
	}()
	if _, err := e.createSlot(ctx, slot); err != nil {
		return nil, err
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=%s", e.pg.Port(), database)
	cmd := exec.CommandContext(ctx, filepath.Join(e.pg.BinDir(), "pg_recvlogical"),
		"-d", conninfo, "--slot", slot, "--start", "-s", "1",
		"-o", "proto_version=1", "-o", "publication_names="+publication, "-f", "/dev/null")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pg_recvlogical: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		<-exited
	}()
	walsender, err := e.waitSlotActive(ctx, slot)
	if err != nil {
		return nil, err
	}
	probe := cpuProbe{pgPID: e.pgPID, kafkaPID: e.kafkaPID, clientPID: cmd.Process.Pid, pathPID: walsender}
	spec := loadSpec{dsn: e.dsn, table: outboxTable, aggType: aggType, rate: rate, writers: opts.Writers, duration: opts.Duration, txRows: rows}
	commitNs := make([]int64, spec.maxEvents())
	e.waitQuiet(ctx, res.label()+" at "+thousands(rate)+"/s")
	a := probe.snap()
	committed, window, err := runLoad(ctx, spec, commitNs, nil)
	res.wrote(committed, window)
	if err != nil {
		return res, err
	}
	end, err := e.currentLSN(ctx)
	if err != nil {
		return res, err
	}
	if err := e.waitSent(ctx, walsender, end, opts.SettleWait); err != nil {
		return res, err
	}
	waitReaped(e.pgPID, 2*time.Second)
	res.CPU = usage(a, probe.snap())
	res.Received = int64(committed)
	log.Info("floor run", "walsender_us_per_event", round(usPerEvent(res.CPU.PostgresPath, committed), 1),
		"client_us_per_event", round(usPerEvent(res.CPU.Client, committed), 1))
	return res, nil
}

// waitSlotActive waits until a walsender holds slot and returns its pid.
func (e *env) waitSlotActive(ctx context.Context, slot string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if pid := e.slotPID(ctx, slot); pid != 0 {
			return pid, nil
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return 0, fmt.Errorf("slot %s: no walsender: %w", slot, err)
		}
	}
}

// waitSent waits until walsender has sent the WAL up to lsn.
func (e *env) waitSent(ctx context.Context, walsender int, lsn string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		var done bool
		err := e.conn.QueryRow(ctx, "SELECT sent_lsn >= $2::pg_lsn FROM pg_stat_replication WHERE pid = $1", walsender, lsn).Scan(&done)
		if err == nil && done {
			return nil
		}
		if serr := sleepCtx(ctx, 10*time.Millisecond); serr != nil {
			return fmt.Errorf("walsender %d has not sent up to %s: %w", walsender, lsn, errors.Join(serr, err))
		}
	}
}

// defaults is the connector's configuration at its defaults; the floor
// producer and the relay take its buffer limits.
var defaults = config.Default()

// floorProducerOpts are the connector's client settings at its defaults
// (sink.New with internal/config's Default()): idempotent, acks=all, the
// murmur2 sticky key partitioner, no linger, no compression, the default
// batch cap and buffer limits.
func floorProducerOpts(brokers []string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ClientID("outbox-bench-producer-floor"),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerLinger(0),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(1_000_012),
		kgo.MaxBufferedRecords(defaults.Kafka.MaxBufferedRecords),
		kgo.MaxBufferedBytes(int(defaults.Kafka.MaxBufferedBytes)),
	}
}

// floorRecord is the record the connector makes of event seq with its
// default headers.
func floorRecord(topic, aggType string, seq int) *kgo.Record {
	return &kgo.Record{
		Topic: topic,
		Key:   []byte("agg-" + strconv.Itoa(seq%aggregates)),
		Value: []byte(payload(seq)),
		Headers: []kgo.RecordHeader{
			{Key: wire.HeaderID, Value: []byte(eventID(seq))},
			{Key: wire.HeaderEventType, Value: []byte("OrderPlaced")},
			{Key: wire.HeaderAggregateType, Value: []byte(aggType)},
		},
		Timestamp: time.Now(),
	}
}

// runProducerFloor produces the run's records at rate from one paced loop
// and accounts the broker's CPU until the last record is consumed; the
// latency is produce call to consume.
func runProducerFloor(ctx context.Context, e *env, opts options, rate int, log *slog.Logger) (*SteadyResult, error) {
	ctx, cancel := context.WithTimeout(ctx, opts.Duration+opts.SettleWait+time.Minute)
	defer cancel()
	aggType := fmt.Sprintf("steady_producer_%d", rate)
	topic := "outbox.event." + aggType
	res := &SteadyResult{System: floorProducer, OfferedRate: rate}
	log = log.With("scenario", "steady", "system", floorProducer, "rate", rate)
	defer e.deleteTopics(ctx, topic)
	if err := e.createTopics(ctx, topic); err != nil {
		return nil, err
	}
	n := int(float64(rate) * opts.Duration.Seconds())
	arr := newArrivals(n + warmup)
	cons, err := startConsumer(ctx, e.brokers, topic, arr, log)
	if err != nil {
		return nil, err
	}
	defer cons.stop()
	cl, err := kgo.NewClient(floorProducerOpts(e.brokers)...)
	if err != nil {
		return nil, fmt.Errorf("producer floor: %w", err)
	}
	defer cl.Close()
	for i := range warmup {
		if err := cl.ProduceSync(ctx, floorRecord(topic, aggType, n+i)).FirstErr(); err != nil {
			return nil, fmt.Errorf("producer floor warm-up: %w", err)
		}
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	err = arr.waitDistinct(wctx, warmup)
	wcancel()
	if err != nil {
		return nil, fmt.Errorf("producer floor warm-up: %w", err)
	}
	commitNs := make([]int64, n)
	probe := cpuProbe{pgPID: e.pgPID, kafkaPID: e.kafkaPID}
	e.waitQuiet(ctx, floorProducer+" at "+thousands(rate)+"/s")
	a := probe.snap()
	produced, window, err := produceAt(ctx, cl, topic, aggType, rate, opts.Duration, commitNs)
	res.wrote(produced, window)
	if err != nil {
		return res, err
	}
	sctx, scancel := context.WithTimeout(ctx, opts.SettleWait)
	err = arr.waitDistinct(sctx, int64(produced+warmup))
	scancel()
	res.CPU = usage(a, probe.snap())
	res.Received = arr.distinct.Load() - warmup
	if err != nil {
		return res, fmt.Errorf("%w: %v", errLost, err)
	}
	if err := cons.stop(); err != nil {
		return res, err
	}
	res.Duplicates = arr.records.Load() - arr.distinct.Load()
	exact, ts := latencies(commitNs, arr)
	res.CommitToConsume, res.CommitToConsumeTS = percentiles(exact), percentiles(ts)
	log.Info("floor run", "broker_us_per_event", round(usPerEvent(res.CPU.Kafka, produced), 1),
		"p99_ms", round(res.CommitToConsume.P99Ms, 2))
	return res, nil
}

// produceAt produces record i at start + i/rate until duration has passed,
// without waiting for acknowledgements (as the connector does); commitNs[i]
// is the produce call's time. It returns how many were acknowledged once
// everything was flushed.
func produceAt(ctx context.Context, cl *kgo.Client, topic, aggType string, rate int, duration time.Duration, commitNs []int64) (int, time.Duration, error) {
	nsPerEvent := 1e9 / float64(rate)
	start := time.Now().Add(20 * time.Millisecond)
	end := start.Add(duration)
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	var (
		acked atomic.Int64
		mu    sync.Mutex
		errs  []error
	)
	done := func(_ *kgo.Record, err error) {
		if err == nil {
			acked.Add(1)
			return
		}
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for i := range commitNs {
		at := start.Add(time.Duration(float64(i) * nsPerEvent))
		if d := time.Until(at); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				return int(acked.Load()), time.Since(start), ctx.Err()
			case <-timer.C:
			}
		}
		if !time.Now().Before(end) {
			break
		}
		commitNs[i] = time.Now().UnixNano()
		cl.Produce(ctx, floorRecord(topic, aggType, i), done)
	}
	window := min(time.Since(start), duration)
	if err := cl.Flush(ctx); err != nil {
		return int(acked.Load()), window, fmt.Errorf("producer floor: flush: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return int(acked.Load()), window, fmt.Errorf("producer floor: %w", err)
	}
	return int(acked.Load()), window, nil
}

func usPerEvent(seconds float64, events int) float64 {
	if events <= 0 {
		return 0
	}
	return seconds * 1e6 / float64(events)
}
