package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

// Environment variables of the suite (the connector never sees them).
const (
	// EnvMode selects the long run (make chaos): OUTBOX_CDC_CHAOS=long.
	EnvMode = "OUTBOX_CDC_CHAOS"
	// EnvSeed replays a run: OUTBOX_CDC_CHAOS_SEED=<seed printed by a run>.
	EnvSeed = "OUTBOX_CDC_CHAOS_SEED"
	// EnvSkip leaves fault kinds out of the run (comma list), e.g. the
	// operations whose connector support is not there yet. Skipping
	// ops-partition also leaves the outbox unpartitioned. The report names
	// the skipped kinds.
	EnvSkip = "OUTBOX_CDC_CHAOS_SKIP"
	// EnvOnly runs the named fault kinds, each n times, and nothing else,
	// with the mode's writers and checks: OUTBOX_CDC_CHAOS_ONLY=kafka-kill-after-endtxn=12
	// (a focused replay of a kind a run failed on), or a comma list,
	// OUTBOX_CDC_CHAOS_ONLY=pg-restore-writing=2,pg-restore-older=1.
	EnvOnly = "OUTBOX_CDC_CHAOS_ONLY"
)

// Fault kinds.
const (
	fConnKill    = "connector-kill"
	fConnKillAck = "connector-kill-after-ack"
	// fStandbyTakeover: a standby beside the active connector takes over
	// when the active one is killed or stopped (takeover_test.go).
	fStandbyTakeover = "connector-standby-takeover"
	fKafkaKill       = "kafka-kill"
	fKafkaStop       = "kafka-stop-8s"
	fPGFast          = "pg-fast-restart"
	fPGCrash         = "pg-crash-restart"
	fPGImmediate     = "pg-immediate-restart"
	fPGRestore       = "pg-restore"        // restore_test.go
	fPGPromote       = "pg-promote-behind" // promote_test.go
	fNetKafkaDrop    = "net-kafka-drop"
	fNetKafkaStall   = "net-kafka-stall"
	fNetKafkaSlow    = "net-kafka-slow"
	fNetKafkaReset   = "net-kafka-reset"
	fNetPGDrop       = "net-pg-drop"
	fNetPGStall      = "net-pg-stall"
	fNetPGSlow       = "net-pg-slow"
	fNetPGReset      = "net-pg-reset"
	// EndTxn faults of the Kafka proxy (kafkaframes.go), exactly_once only:
	// a commit answered with a retriable error for a while although it
	// happened, a commit that never reaches the coordinator, an abort
	// whose answer is cut.
	fNetKafkaForge   = "net-kafka-endtxn-forge"
	fNetKafkaSwallow = "net-kafka-endtxn-swallow"
	fNetKafkaAbort   = "net-kafka-abort-cut"
	// fKafkaKillCommit: an EndTxn commit reaches the coordinator, its answer
	// is cut and the broker is killed at once: the commit is decided or not
	// when it dies, and finished (markers written) only after its restart.
	fKafkaKillCommit = "kafka-kill-after-endtxn"
	// Operations (ops_test.go): schema, publication and checkpoint changes
	// an operator makes under load.
	fOpsPartition   = "ops-partition"
	fOpsAddColumn   = "ops-add-column"
	fOpsDropMapped  = "ops-drop-mapped-column"
	fOpsPubGap      = "ops-publication-gap"
	fOpsForeignCkpt = "ops-foreign-checkpoint"
	fOpsOversize    = "ops-oversize"
	// Table-less events in a publication gap; redrive, and parking-topic
	// retention before one (messages_test.go, redrive_test.go).
	fOpsPubGapMsg, fOpsRedrive, fOpsParkingRetention = "ops-publication-gap-messages", "ops-redrive", "ops-parking-retention"
)

// Restores the writers do not wait for (restore_writing_test.go): they go on
// at once and pass the old WAL end before the connector reconnects; the same
// under the default postgres.reconnect_backoff_max; two restores, the second
// from a copy older than the first's; and, in exactly_once, over a compacted
// topic whose cleaner ran before it (compacted_test.go).
const (
	fPGRestoreWriting   = "pg-restore-writing"
	fPGRestoreBackoff   = "pg-restore-default-backoff"
	fPGRestoreOlder     = "pg-restore-older"
	fPGRestoreCompacted = "pg-restore-compacted"
)

var allFaults = []string{fConnKill, fConnKillAck, fStandbyTakeover, fKafkaKill, fKafkaStop, fPGFast, fPGCrash, fPGImmediate, fPGRestore, fPGPromote,
	fPGRestoreWriting, fPGRestoreBackoff, fPGRestoreOlder, fPGRestoreCompacted,
	fNetKafkaDrop, fNetKafkaStall, fNetKafkaSlow, fNetKafkaReset, fNetPGDrop, fNetPGStall, fNetPGSlow, fNetPGReset,
	fNetKafkaForge, fNetKafkaSwallow, fNetKafkaAbort, fKafkaKillCommit, fOpsPartition, fOpsAddColumn, fOpsDropMapped, fOpsPubGap, fOpsForeignCkpt, fOpsOversize,
	fOpsPubGapMsg, fOpsRedrive, fOpsParkingRetention, fOpsPubFlapStopped,
	fConnKillLarge, fKafkaKillLarge, fPGRestartLarge}

// onlyKind narrows m to OUTBOX_CDC_CHAOS_ONLY's kinds, each n times, if set.
func onlyKind(t *testing.T, m mode) mode {
	v := os.Getenv(EnvOnly)
	if v == "" {
		return m
	}
	deck := map[string]int{}
	var names []string
	for item := range strings.SplitSeq(v, ",") {
		kind, count, _ := strings.Cut(strings.TrimSpace(item), "=")
		n, err := strconv.Atoi(count)
		if !slices.Contains(allFaults, kind) || err != nil || n <= 0 {
			t.Fatalf("%s=%q: want <kind>=<count>[,<kind>=<count>...], kinds of %s", EnvOnly, v, strings.Join(allFaults, ", "))
		}
		deck[kind] += n
		names = append(names, kind)
	}
	m.Name += "-only-" + strings.Join(names, "-")
	m.Deck, m.MinChaos, m.MinFaults = deck, 0, 0
	t.Logf("chaos: %s: only %v", EnvOnly, deck)
	return m
}

// deckOnly are the kinds drawn from the deck only, never at random after
// it: a promotion (see longMode) and the restores that take a minute or
// more (a default reconnect backoff, two restores in one fault).
var deckOnly = map[string]bool{fPGPromote: true, fPGRestoreBackoff: true, fPGRestoreOlder: true, fPGRestoreCompacted: true}

// faultClass groups the kinds for the report.
func faultClass(kind string) string {
	switch {
	case strings.HasPrefix(kind, "connector-"):
		return "connector"
	case strings.HasPrefix(kind, "kafka-"):
		return "kafka"
	case strings.HasPrefix(kind, "pg-"):
		return "postgres"
	case strings.HasPrefix(kind, "net-"):
		return "network"
	case strings.HasPrefix(kind, "ops-"):
		return "operations"
	}
	return "other"
}

// kafkaStopDowntime is how long kafka-stop-8s keeps the broker down: longer
// than the connector's kafka.request_timeout (5s).
const kafkaStopDowntime = 8 * time.Second

// mode is the shape of one run.
type mode struct {
	Name          string
	Writers       int
	AggsPerWriter int
	Interval      time.Duration // mean pause between a writer's transactions
	Multi         float64       // share of multi-event transactions
	// Deck is the minimum number of each fault; the deck is shuffled, and
	// after it random faults are drawn until MinChaos has passed.
	Deck     map[string]int
	MinChaos time.Duration
	// MinFaults: random faults are drawn until this many ran too (issue
	// 13 asks for at least 100 in the exactly_once soak).
	MinFaults int
	GapMin    time.Duration // quiet time between two faults
	GapMax    time.Duration
	// WaitProb is the chance of waiting for the pipeline to catch up before
	// the next fault; otherwise the next fault may hit a recovery.
	WaitProb float64
	// Budget bounds the fault phase; the checks need time after it.
	Budget time.Duration
	// CatchUp bounds the wait for every committed event to be delivered
	// after a fault; longer is a hang.
	CatchUp time.Duration
}

var shortMode = mode{
	Name: "short", Writers: 4, AggsPerWriter: 3, Interval: 20 * time.Millisecond, Multi: 0.25,
	Deck: map[string]int{
		fConnKill: 4, fConnKillAck: 3, fStandbyTakeover: 1,
		fKafkaKill: 3, fKafkaStop: 2,
		fPGFast: 3, fPGCrash: 2, fPGImmediate: 1, fPGRestore: 1, fPGPromote: 1,
		fPGRestoreWriting: 1, fPGRestoreBackoff: 1, fPGRestoreOlder: 1, fPGRestoreCompacted: 1,
		fNetKafkaDrop: 1, fNetKafkaStall: 1, fNetKafkaSlow: 1, fNetKafkaReset: 1,
		fNetPGDrop: 1, fNetPGStall: 1, fNetPGSlow: 1, fNetPGReset: 1,
		fNetKafkaForge: 1, fNetKafkaSwallow: 1, fNetKafkaAbort: 1, fKafkaKillCommit: 1,
		fOpsPartition: 1, fOpsAddColumn: 1, fOpsDropMapped: 1, fOpsPubGap: 1, fOpsForeignCkpt: 1, fOpsOversize: 1,
		fOpsPubGapMsg: 1, fOpsRedrive: 1, fOpsParkingRetention: 1, fOpsPubFlapStopped: 1,
		fConnKillLarge: 1, fKafkaKillLarge: 1, fPGRestartLarge: 1, // largetxn_test.go
	},
	GapMin: 300 * time.Millisecond, GapMax: 1500 * time.Millisecond, WaitProb: 0.6,
	// Short runs with pg-restore and pg-promote-behind used 282–287 s of
	// 5 min; the restores under load add about a minute.
	Budget: 8 * time.Minute, CatchUp: time.Minute,
}

var longMode = mode{
	Name: "long", Writers: 4, AggsPerWriter: 3, Interval: 20 * time.Millisecond, Multi: 0.25,
	Deck: map[string]int{
		fConnKill: 12, fConnKillAck: 10, fStandbyTakeover: 5,
		fKafkaKill: 4, fKafkaStop: 3,
		// One promotion: a standby of an already promoted server never got
		// ready in the first long run (to investigate; see pgPromoteBehind).
		fPGFast: 4, fPGCrash: 4, fPGImmediate: 2, fPGRestore: 2, fPGPromote: 1,
		fPGRestoreWriting: 3, fPGRestoreBackoff: 1, fPGRestoreOlder: 2, fPGRestoreCompacted: 2,
		fNetKafkaDrop: 3, fNetKafkaStall: 3, fNetKafkaSlow: 3, fNetKafkaReset: 3,
		fNetPGDrop: 3, fNetPGStall: 3, fNetPGSlow: 3, fNetPGReset: 3,
		fNetKafkaForge: 3, fNetKafkaSwallow: 3, fNetKafkaAbort: 2, fKafkaKillCommit: 3,
		fOpsPartition: 4, fOpsAddColumn: 3, fOpsDropMapped: 2, fOpsPubGap: 3, fOpsForeignCkpt: 2, fOpsOversize: 3,
		fOpsPubGapMsg: 2, fOpsRedrive: 2, fOpsParkingRetention: 2, fOpsPubFlapStopped: 3,
		fConnKillLarge: 2, fKafkaKillLarge: 2, fPGRestartLarge: 2,
	},
	MinChaos: 9 * time.Minute, MinFaults: 100,
	GapMin: 500 * time.Millisecond, GapMax: 4 * time.Second, WaitProb: 0.6,
	Budget: 16 * time.Minute, CatchUp: 2 * time.Minute,
}

// faultRecord is one injected fault.
type faultRecord struct {
	Kind   string
	Start  time.Time
	End    time.Time // the faulty component is back (see report)
	Detail string
	// Recovery, filled in by the analysis.
	FirstDelivery time.Duration // End → first event consumed that had not been consumed before
	CaughtUp      time.Duration // End → every event committed before End consumed
	Measured      bool          // false when the next fault began before recovery
	// AckEvent is, for connector-kill-after-ack, the last event of the
	// burst: consumed (so acknowledged) before the kill.
	AckEvent string
	// Kills is the number of SIGKILLs the fault sent to the connector.
	Kills int
	// restarted is when a killed connector was started again: the end of
	// a connector fault (its start-up counts as recovery).
	restarted time.Time
	// ExpectedExit describes the exit an operations fault required of the
	// connector (exit code 1 and the message), when it did.
	ExpectedExit string
	// Rewound: a restore or a promotion undid committed transactions, and
	// the old server was down from then on (restore_test.go); NewStream:
	// the server after it has a new slot (a promotion below PostgreSQL 17).
	Rewound   time.Time
	NewStream bool
	// EarlierRewinds are the restores of the fault before Rewound
	// (pg-restore-older restores twice).
	EarlierRewinds []time.Time
	// Large is the transaction a large-transaction kind wrote (largetxn_test.go).
	Large *largeTxn `json:",omitempty"`
}

// rewinds are the times the fault rewound the server, in order.
func (f *faultRecord) rewinds() []time.Time {
	if f.Rewound.IsZero() {
		return nil
	}
	return append(slices.Clone(f.EarlierRewinds), f.Rewound)
}

// rewindAt notes a rewind at t, after any the fault made before.
func (f *faultRecord) rewindAt(t time.Time) {
	if !f.Rewound.IsZero() {
		f.EarlierRewinds = append(f.EarlierRewinds, f.Rewound)
	}
	f.Rewound = t
}

// run is one chaos run.
type run struct {
	t      *testing.T
	m      mode
	seed   uint64
	rng    *mrand.Rand
	dsn    string // direct
	prefix string
	topics []string // outbox topics
	dlq    string
	// bigTopic is the topic of aggregate type "big": max.message.bytes is
	// bigTopicMaxBytes, and ops-oversize writes events larger than that.
	bigTopic string
	pub      string // publication (the connector creates it)
	// partitioned: the outbox is RANGE-partitioned on bucket; bucket is the
	// writers' current partition key, scratch the empty partition the next
	// ops-partition detaches and drops.
	partitioned bool
	bucket      atomic.Int64
	scratch     int
	opsN        int // operations faults so far, for unique names
	skip        map[string]bool

	conn   *connector
	live   *liveConsumer
	samp   *sampler
	ledger *ledger
	wstats *writerStats
	burst  *writer
	big    *writer // ops-oversize
	mixer  *writer // ops-publication-gap-messages (messages_test.go)
	fill   *writer // the padded rows of the restores under load (restore_writing_test.go)
	large  *writer // the large transactions (largetxn_test.go)

	// compacted: the run has the compacted topic; cmp writes its events
	// (compacted_test.go).
	compacted bool
	cmp       *writer

	rd     redriveState
	faults []faultRecord
	exits  []string // unexpected connector exits, with evidence
	// runbooks: hanging transactions the connector stopped on, and the
	// abort the suite made for it (hanging_test.go).
	runbooks []string
	hangs    []string // catch-up timeouts
	// expectedExits are the exits the operations faults required (exit 1
	// and the message); opsFailures what went wrong with them (a connector
	// that did not stop, or stopped the wrong way).
	expectedExits []string
	opsFailures   []string
	workers       chan error
	// flowStart: the writers run from before it; verify checks the rows
	// written since.
	flowStart time.Time
	// lastDeleted is the last connector process's count of rows retention
	// deleted, read before the final stop (-1: not read; retention_test.go).
	lastDeleted float64
	// firstPrimary is env.pg before the first promotion (promote_test.go).
	firstPrimary *testenv.Postgres
	// held: the slow writers' holds (slow_test.go); second: the second
	// logical slot (secondslot_test.go).
	held   *heldLog
	second *secondSlot
	// slotLost: table-less events a lagging promotion's lost slot took
	// (lostslot_test.go), id → description.
	slotLost map[string]string
	// repairRuns: the lost slots' verify --repair runs (lostorder_test.go).
	repairRuns []repairRun
}

func TestChaos(t *testing.T) {
	if env.skip != "" {
		t.Skip(env.skip)
	}
	began := time.Now()
	m := shortMode
	if os.Getenv(EnvMode) == "long" {
		m = longMode
	}
	m = onlyKind(t, m)
	seed := mrand.Uint64()
	if s := os.Getenv(EnvSeed); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", EnvSeed, s, err)
		}
		seed = v
	}
	t.Logf("chaos: mode %s, seed %d (replay the fault schedule with %s=%d)", m.Name, seed, EnvSeed, seed)

	// The whole test must end before go test's own deadline, leaving time
	// for the checks and cleanup.
	deadline := time.Now().Add(m.Budget + 6*time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-30*time.Second).Before(deadline) {
		deadline = d.Add(-30 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()

	r := &run{t: t, m: m, seed: seed, rng: mrand.New(mrand.NewPCG(seed, 0x6368616f73)),
		ledger: &ledger{}, wstats: &writerStats{}, live: newLiveConsumer(), workers: make(chan error, 64)}
	r.skip = skippedKinds(t)
	eosSkip(t, r.skip)
	r.partitioned = !r.skip[fOpsPartition]
	r.setup(ctx)
	r.setupSecondSlot(ctx)

	// Observers and writers run for the whole chaos phase.
	obsCtx, stopObs := context.WithCancel(ctx)
	var obsWG sync.WaitGroup
	defer func() { stopObs(); obsWG.Wait() }()
	ready := make(chan error, 1)
	// The live consumer reads the big, dead-letter and parking topics too:
	// the events ops-oversize writes end there.
	r.live.keepCopies(r.parkingTopic(), r.bigTopic, r.compactTopic()) // redrive_test.go, compacted_test.go
	obsWG.Go(func() { r.live.run(obsCtx, append(slices.Clone(r.topics), r.bigTopic, r.dlq, r.parkingTopic()), ready) })
	if err := <-ready; err != nil {
		t.Fatalf("live consumer: %v", err)
	}
	obsWG.Go(func() { r.samp.run(obsCtx, 50*time.Millisecond) })
	obsWG.Go(func() { r.second.run(obsCtx) })

	if _, err := r.conn.start(ctx, "initial"); err != nil {
		t.Fatalf("start connector: %v\n%s", err, r.conn.logTail(40))
	}
	stopWriters := make(chan struct{})
	var wWG sync.WaitGroup
	for w := range m.Writers {
		aggs := make([]*aggregate, m.AggsPerWriter)
		for a := range aggs {
			typ := []string{"order", "payment"}[(w+a)%2]
			aggs[a] = &aggregate{id: fmt.Sprintf("w%d-a%d", w, a), typ: typ, next: 1}
		}
		wr := newWriter(w, r.dsn, aggs, m.Multi, seed, r.ledger, r.wstats)
		wr.bucket = &r.bucket
		wr.msgAggs, wr.msgProb = messageAggs(w), messageProb // table-less events (messages_test.go)
		wr.backdate = backdateProb                           // slow_test.go
		wWG.Go(func() {
			if err := wr.run(ctx, stopWriters, m.Interval); err != nil {
				r.workers <- fmt.Errorf("writer %d: %w", w, err)
			}
		})
	}
	r.startSecondWriters(ctx, stopWriters, &wWG, m, seed)
	r.startSlowWriters(ctx, stopWriters, &wWG, m, seed)
	r.burst = newWriter(m.Writers, r.dsn, []*aggregate{{id: "burst", typ: "order", next: 1}}, 0, seed, r.ledger, r.wstats)
	r.burst.bucket = &r.bucket
	defer r.burst.closeConn()
	r.big = newWriter(m.Writers+1, r.dsn, []*aggregate{{id: "big", typ: "big", next: 1}}, 0, seed, r.ledger, r.wstats)
	r.big.bucket, r.big.pad = &r.bucket, oversizePad
	defer r.big.closeConn()
	stopAll := func() {
		select {
		case <-stopWriters:
		default:
			close(stopWriters)
		}
	}
	// On a failure, cancel too: a writer retries its transaction until ctx ends.
	defer func() { stopAll(); cancel(); wWG.Wait() }()

	// Let the load settle before the first fault. The bound is for a
	// connector that never delivers, not a speed check: on a loaded machine
	// the first records can take tens of seconds, and that is reported.
	flowStart := time.Now()
	r.flowStart = flowStart
	if err := r.waitFlowing(ctx, 2*time.Minute); err != nil {
		t.Fatalf("no events flowing before the faults: %v\n%s", err, r.conn.logTail(40))
	}
	if d := time.Since(flowStart); d > 10*time.Second {
		t.Logf("chaos: the first 50 records took %v to arrive", d.Round(time.Millisecond))
	}

	chaosStart := time.Now()
	r.inject(ctx)
	chaosEnd := time.Now()

	// Stop the writers between transactions, then wait for every
	// committed event to arrive.
	stopAll()
	wDone := make(chan struct{})
	go func() { wWG.Wait(); close(wDone) }()
	select {
	case <-wDone:
	case <-time.After(2 * time.Minute):
		t.Errorf("writers did not stop within 2m")
	}
	r.drainWorkerErrors()
	r.checkConnector(ctx)
	final := r.m.CatchUp + r.m.CatchUp/2
	if len(r.hangs) > 0 {
		final = 15 * time.Second // the run already timed out waiting once
	}
	if err := r.waitCaughtUp(ctx, time.Now(), final); err != nil {
		r.hangs = append(r.hangs, fmt.Sprintf("final catch-up: %v", err))
		t.Errorf("not every committed event was delivered after the last fault: %v\n%s\n%s", err, r.conn.logTail(60), r.conn.keepGoroutines())
	}
	r.lastDeleted = -1
	if n, err := r.conn.metric(deletedMetric); err == nil {
		r.lastDeleted = n
	} else {
		t.Logf("chaos: %s of the last process: %v", deletedMetric, err)
	}
	if err := r.conn.stop(time.Minute); err != nil {
		t.Errorf("clean stop: %v\n%s", err, r.conn.logTail(40))
	}
	// One more slot sample after the final confirmation: wait until the
	// sampler has taken one queried wholly after the stop.
	stopped := time.Now()
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	for r.samp.samplesAfter(stopped) < 2 {
		if !sleepCtx(sctx, 10*time.Millisecond) { // poll interval of the sampler's readings
			t.Errorf("no slot sample within 30s of the connector's stop (%d readings failed)", r.samp.failed.Load())
			break
		}
	}
	scancel()
	stopObs()
	obsWG.Wait()

	rep := r.analyze(ctx)
	rep.Mode, rep.Seed = modeName(m), seed
	rep.ChaosSeconds = chaosEnd.Sub(chaosStart).Seconds()
	rep.WallSeconds = time.Since(began).Seconds()
	r.report(rep)
}

// setup creates the database, the outbox table, the topics and the
// connector's configuration.
func (r *run) setup(ctx context.Context) {
	t := r.t
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	id := hex.EncodeToString(suffix)
	r.prefix = "chaos-" + id
	r.topics = []string{r.prefix + ".order", r.prefix + ".payment"}
	r.dlq = r.prefix + "-dlq"
	r.bigTopic = r.prefix + ".big"
	r.topics = append(r.topics, secondTopic(r.prefix)) // tables_test.go
	slot := "chaos_" + id
	r.pub = slot

	db := fmt.Sprintf("chaos_%s_%d", id, os.Getpid())
	dsn, err := env.pg.CreateDatabase(ctx, db)
	if err != nil {
		t.Fatalf("create database: %v", err)
	}
	r.dsn = dsn
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	ddl := outboxDDL(r.partitioned) + ";\n" + secondTableDDL + ";\n" + retentionDDL
	r.bucket.Store(1)
	r.scratch = 1
	_, err = conn.Exec(ctx, ddl)
	conn.Close(context.Background())
	if err != nil {
		t.Fatalf("create outbox: %v", err)
	}

	// Topics are created up front, with the broker's append time as the
	// record timestamp: it says when each copy entered the log, which the
	// watermark check uses as proof of acknowledgement.
	cl, err := newKafkaClient()
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	cfg := map[string]*string{"message.timestamp.type": kadm.StringPtr("LogAppendTime")}
	for _, spec := range []struct {
		topics []string
		parts  int32
		cfg    map[string]*string
	}{{r.topics, 3, cfg}, {[]string{r.dlq}, 1, cfg}, {[]string{r.parkingTopic()}, 1, cfg}, {[]string{r.bigTopic}, 1, map[string]*string{
		"message.timestamp.type": kadm.StringPtr("LogAppendTime"),
		"max.message.bytes":      kadm.StringPtr(strconv.Itoa(bigTopicMaxBytes)),
	}}} {
		resps, err := adm.CreateTopics(ctx, spec.parts, 1, spec.cfg, spec.topics...)
		if err == nil {
			err = resps.Error()
		}
		if err != nil {
			t.Fatalf("create topics %v: %v", spec.topics, err)
		}
	}
	// A KRaft broker applies a new topic after CreateTopics returns; a
	// producer that asks before then waits out its unknown-topic retries.
	if err := waitTopicsLed(ctx, adm, append(slices.Clone(r.topics), r.dlq, r.bigTopic)); err != nil {
		t.Fatal(err)
	}
	if err := r.setupCompacted(ctx, adm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cl, err := newKafkaClient()
		if err != nil {
			return
		}
		defer cl.Close()
		if err := cdctest.DeleteTopics(ctx, kadm.NewClient(cl), append(slices.Clone(r.topics), r.dlq, r.bigTopic)...); err != nil {
			t.Logf("%v", err)
		}
	})

	dir := t.TempDir()
	httpPort, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	sparePort, err := testenv.FreePort() // a standby's (takeover_test.go)
	if err != nil {
		t.Fatal(err)
	}
	proxiedDSN := fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", env.pgProxy.Addr(), db)
	yaml := fmt.Sprintf(`postgres:
  dsn: %q
  slot: %s
  publication: %s
  status_interval: 100ms
  reconnect_backoff_max: 1s
%skafka:
  brokers: [%q]
  topic: %q
  dlq_topic: %q
  parking_topic: %q
  quarantine_topic: %q
  request_timeout: 5s
  # Small enough that a Kafka outage of a few seconds fills the producer
  # buffer and exercises backpressure (the stream stops reading WAL).
  max_buffered_records: 1000
http:
  listen: "127.0.0.1:%d"
  pprof: true # a hang's goroutine dump (keepGoroutines)
log:
  level: info
`, proxiedDSN, slot, slot, outboxSection(r.prefix), env.brokerProxy.Addr(), r.prefix+".{aggregate_type}", r.dlq, r.parkingTopic(), r.quarantineTopic(), httpPort)
	yaml = withDelivery(yaml, r.prefix)
	cfgPath := filepath.Join(dir, "outbox-cdc.yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	r.conn = &connector{bin: env.bin, cfgPath: cfgPath, httpAddr: fmt.Sprintf("127.0.0.1:%d", httpPort),
		spareAddr: fmt.Sprintf("127.0.0.1:%d", sparePort),
		logPath:   filepath.Join(dir, "connector.log"), dsn: dsn, slot: slot}
	t.Cleanup(r.conn.close)
	r.samp = &sampler{dsn: dsn, slot: slot}
	shape := "plain"
	if r.partitioned {
		shape = "RANGE-partitioned on created_at, its one partition on bucket"
	}
	t.Logf("chaos: database %s, slot and publication %s, outbox %s, topics %s.{order,payment,big}, %s, %s", db, slot, shape, r.prefix, env.brokerProxy, env.pgProxy)
}

// inject runs the fault schedule.
func (r *run) inject(ctx context.Context) {
	t := r.t
	var deck, kinds []string
	for _, k := range allFaults {
		if r.skip[k] {
			continue
		}
		if !deckOnly[k] {
			kinds = append(kinds, k)
		}
		for range r.m.Deck[k] {
			deck = append(deck, k)
		}
	}
	r.rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
	start := time.Now()
	budgetEnd := start.Add(r.m.Budget)
	for i := 0; ; i++ {
		var kind string
		switch {
		case i < len(deck):
			kind = deck[i]
		case time.Since(start) < r.m.MinChaos || len(r.faults) < r.m.MinFaults:
			kind = kinds[r.rng.IntN(len(kinds))]
		default:
			return
		}
		if time.Now().After(budgetEnd) {
			t.Errorf("fault budget %v exhausted after %d of %d faults", r.m.Budget, i, len(deck))
			return
		}
		if ctx.Err() != nil {
			t.Errorf("deadline reached during the faults: %v", ctx.Err())
			return
		}
		r.drainWorkerErrors()
		r.checkConnector(ctx)

		f := faultRecord{Kind: kind, Start: time.Now()}
		detail, err := r.doFault(ctx, kind, &f)
		f.End, f.Detail = time.Now(), detail
		if !f.restarted.IsZero() {
			f.End = f.restarted
		}
		r.faults = append(r.faults, f)
		t.Logf("chaos: fault %2d %-26s %6.2fs  %s", len(r.faults), kind, f.End.Sub(f.Start).Seconds(), detail)
		if err != nil {
			t.Fatalf("fault %s: %v\nconnector log:\n%s", kind, err, r.conn.logTail(40))
		}
		r.checkConnector(ctx)
		if r.rng.Float64() < r.m.WaitProb {
			if err := r.waitCaughtUp(ctx, f.End, r.m.CatchUp); err != nil {
				r.hangs = append(r.hangs, fmt.Sprintf("after %s at %s: %v", kind, f.End.Format("15:04:05.000"), err))
				t.Errorf("no catch-up within %v after %s: %v\nconnector log:\n%s\n%s", r.m.CatchUp, kind, err, r.conn.logTail(60), r.conn.keepGoroutines())
				return
			}
		}
		gap := r.m.GapMin + time.Duration(r.rng.Int64N(int64(r.m.GapMax-r.m.GapMin)+1))
		sleepCtx(ctx, gap) // the schedule's pause between faults
	}
}

func (r *run) between(lo, hi time.Duration) time.Duration {
	return (lo + time.Duration(r.rng.Int64N(int64(hi-lo)+1))).Round(time.Millisecond)
}

// killConnector kills the connector with SIGKILL and starts a new one after
// down.
func (r *run) killConnector(ctx context.Context, f *faultRecord, down time.Duration) (string, error) {
	old, err := r.conn.kill()
	if err != nil {
		return "", err
	}
	f.Kills++
	sleepCtx(ctx, down) // the connector's downtime under test
	var early string
	if r.rng.Float64() < 0.25 {
		// Once in a while, kill the new process again during its start-up
		// (slot and publication setup, checkpoint load, first connection).
		in, err := r.conn.launch(ctx, "after-kill")
		if err != nil {
			return "", err
		}
		d := r.between(0, 150*time.Millisecond)
		sleepCtx(ctx, d) // how far into its start-up it is killed
		if _, err := r.conn.kill(); err != nil {
			return "", err
		}
		f.Kills++
		early = fmt.Sprintf("; #%d killed again %v into its start-up", in.N, d)
	}
	in, err := r.conn.start(ctx, "after-kill")
	if in != nil {
		f.restarted = in.Start
	}
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("killed #%d, down %v%s; #%d resumes after slot %v / checkpoint %v, ready in %v",
		old.N, down.Round(time.Millisecond), early, in.N, in.SlotAtStart, in.CkptAtStart, in.Ready.Sub(in.Start).Round(time.Millisecond)), nil
}

// killAfterAck commits a burst of events, waits until the live consumer
// sees the last one (so the broker has acknowledged it), and kills the
// connector a few milliseconds later: between the acknowledgement and the
// status update that confirms it, or just after.
func (r *run) killAfterAck(ctx context.Context, f *faultRecord) (string, error) {
	n := 10 + r.rng.IntN(30)
	var last event
	for range n {
		evs, err := r.burst.commitNext(ctx)
		if err != nil {
			return "", err
		}
		last = evs[len(evs)-1]
	}
	delay := time.Duration(r.rng.Int64N(int64(5 * time.Millisecond)))
	seen := "seen"
	select {
	case <-r.live.watch(last.ID):
		f.AckEvent = last.ID
	case <-time.After(30 * time.Second): // a bound on the signal above, reported
		seen = "NOT seen within 30s"
	case <-ctx.Done():
		return "", ctx.Err()
	}
	if delay > 0 {
		time.Sleep(delay) // the fault's timing: a few ms after the acknowledgement
	}
	desc, err := r.killConnector(ctx, f, time.Duration(r.rng.Int64N(int64(300*time.Millisecond))))
	return fmt.Sprintf("burst of %d, last event %s, killed %v after it was consumed; %s", n, seen, delay.Round(10*time.Microsecond), desc), err
}

// checkConnector restarts a connector that exited on its own and keeps the
// evidence: the contract says faults are retried, not fatal.
func (r *run) checkConnector(ctx context.Context) {
	in := r.conn.unexpectedExit()
	if in == nil {
		return
	}
	tail := r.conn.logTail(30)
	if hangingExit(tail) {
		// The connector's own runbook (hanging_test.go): an operator's
		// abort, then a restart; not a failure.
		aborted, err := abortHanging(ctx, tail)
		if err != nil {
			r.t.Fatalf("connector #%d stopped on a hanging transaction; its runbook failed: %v\n%s", in.N, err, tail)
		}
		r.runbooks = append(r.runbooks, fmt.Sprintf("connector #%d stopped on a hanging transaction at %s; runbook: %v", in.N, in.ExitAt.Format("15:04:05.000"), aborted))
		r.t.Logf("chaos: %s", r.runbooks[len(r.runbooks)-1])
		if _, err := r.conn.start(ctx, "after-hanging-abort"); err != nil {
			r.t.Fatalf("restart connector after the abort: %v\n%s", err, r.conn.logTail(40))
		}
		return
	}
	msg := fmt.Sprintf("connector #%d exited on its own at %s: %v\n%s", in.N, in.ExitAt.Format("15:04:05.000"), in.err, tail)
	r.exits = append(r.exits, msg)
	r.t.Errorf("%s", msg)
	if _, err := r.conn.start(ctx, "after-exit"); err != nil {
		r.t.Fatalf("restart connector after its exit: %v\n%s", err, r.conn.logTail(40))
	}
}

func (r *run) drainWorkerErrors() {
	for {
		select {
		case err := <-r.workers:
			r.t.Errorf("%v", err)
		default:
			return
		}
	}
}

// waitTopicsLed waits until the broker's metadata has a leader for every
// partition of topics.
func waitTopicsLed(ctx context.Context, adm *kadm.Client, topics []string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		md, err := adm.Metadata(ctx, topics...)
		var missing []string
		for _, name := range topics {
			td, ok := md.Topics[name]
			led := ok && td.Err == nil && len(td.Partitions) > 0
			for _, p := range td.Partitions {
				led = led && p.Err == nil && p.Leader >= 0
			}
			if !led {
				missing = append(missing, name)
			}
		}
		if err == nil && len(missing) == 0 {
			return nil
		}
		if !sleepCtx(ctx, 50*time.Millisecond) { // poll interval of the broker's metadata
			return fmt.Errorf("topics %v have no leader in the broker's metadata after a minute (last error %v)", missing, err)
		}
	}
}

// waitFlowing waits until some events (50 records) have been consumed.
func (r *run) waitFlowing(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for r.live.records.Load() < 50 {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d events committed, %d records consumed after %v", r.ledger.len(), r.live.records.Load(), timeout)
		}
		if !sleepCtx(ctx, 20*time.Millisecond) { // poll interval of the live consumer's count
			return ctx.Err()
		}
	}
	return nil
}

// waitCaughtUp waits until every event committed at or before until has
// been consumed by the live consumer, but the table-less events a lost slot
// took (no row to repair them from).
func (r *run) waitCaughtUp(ctx context.Context, until time.Time, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	cursor := 0
	for {
		evs := r.ledger.since(cursor)
		pending := 0
		var oldest event
		advancing := true
		for _, e := range evs {
			if _, ok := r.live.seenAt(e.ID); ok || r.slotLost[e.ID] != "" { // lostslot_test.go: none will come
				if advancing {
					cursor++
				}
				continue
			}
			advancing = false
			if !e.Committed.After(until) {
				if pending == 0 {
					oldest = e
				}
				pending++
			}
		}
		if pending == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d events committed before %s not consumed after %v; oldest %s (%s seq %d, bucket %d, committed %s, post-commit LSN %v)",
				pending, until.Format("15:04:05.000"), timeout, oldest.ID, oldest.Agg, oldest.Seq, oldest.Bucket,
				oldest.Committed.Format("15:04:05.000"), oldest.PostLSN)
		}
		r.checkConnector(ctx)
		if !sleepCtx(ctx, 25*time.Millisecond) { // poll interval of the live consumer's progress
			return ctx.Err()
		}
	}
}
