package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// faultFunc injects one fault and undoes it; it returns a description.
type faultFunc func(r *run, ctx context.Context, f *faultRecord) (string, error)

// faultFuncs is every kind's injection (allFaults are the kinds, in the
// report's order): OUTBOX_CDC_CHAOS_ONLY and _SKIP name kinds by these keys.
var faultFuncs = map[string]faultFunc{
	fConnKill: func(r *run, ctx context.Context, f *faultRecord) (string, error) {
		return r.killConnector(ctx, f, time.Duration(r.rng.Int64N(int64(800*time.Millisecond))))
	},
	fConnKillAck:     (*run).killAfterAck,
	fStandbyTakeover: (*run).takeover, // takeover_test.go

	fKafkaKill:       kafkaKill,
	fKafkaStop:       kafkaStop,
	fKafkaKillCommit: txnFault(fKafkaKillCommit), // eos_test.go

	fPGFast:      pgRestart(func(ctx context.Context) error { return stopPG(ctx) }),
	fPGCrash:     pgRestart(func(context.Context) error { return env.pg.Crash() }),
	fPGImmediate: pgRestart(func(context.Context) error { return env.pg.ImmediateStop() }),
	// restore_test.go, restore_writing_test.go, compacted_test.go, promote_test.go
	fPGRestore:          (*run).pgRestore,
	fPGRestoreWriting:   pgRestoreUnderLoad(fPGRestoreWriting),
	fPGRestoreBackoff:   pgRestoreUnderLoad(fPGRestoreBackoff),
	fPGRestoreOlder:     pgRestoreUnderLoad(fPGRestoreOlder),
	fPGRestoreCompacted: (*run).pgRestoreCompacted,
	fPGPromote:          (*run).pgPromoteBehind,

	fNetKafkaDrop:  netFault(kafkaSide, netDrop),
	fNetKafkaStall: netFault(kafkaSide, netStall),
	fNetKafkaSlow:  netFault(kafkaSide, netSlow),
	fNetKafkaReset: netFault(kafkaSide, netReset),
	fNetPGDrop:     netFault(pgSide, netDrop),
	fNetPGStall:    netFault(pgSide, netStall),
	fNetPGSlow:     netFault(pgSide, netSlow),
	fNetPGReset:    netFault(pgSide, netReset),
	// EndTxn faults of the Kafka proxy (eos_test.go)
	fNetKafkaForge:   txnFault(fNetKafkaForge),
	fNetKafkaSwallow: txnFault(fNetKafkaSwallow),
	fNetKafkaAbort:   txnFault(fNetKafkaAbort),

	// Operations (ops_test.go, messages_test.go, redrive_test.go, flap_test.go)
	fOpsPartition:        ops(func(r *run, ctx context.Context, _ *faultRecord) (string, error) { return r.opsPartition(ctx) }),
	fOpsAddColumn:        ops(func(r *run, ctx context.Context, _ *faultRecord) (string, error) { return r.opsAddColumn(ctx) }),
	fOpsDropMapped:       ops((*run).opsDropMapped),
	fOpsPubGap:           ops(publicationGap(fOpsPubGap)),
	fOpsPubGapMsg:        ops(publicationGap(fOpsPubGapMsg)),
	fOpsForeignCkpt:      ops((*run).opsForeignCheckpoint),
	fOpsOversize:         ops(func(r *run, ctx context.Context, _ *faultRecord) (string, error) { return r.opsOversize(ctx) }),
	fOpsRedrive:          ops(func(r *run, ctx context.Context, _ *faultRecord) (string, error) { return r.opsRedrive(ctx) }),
	fOpsParkingRetention: ops(func(r *run, ctx context.Context, _ *faultRecord) (string, error) { return r.opsParkingRetention(ctx) }),
	fOpsPubFlapStopped:   ops((*run).opsFlapStopped),

	// One large transaction, hit while the connector publishes it (largetxn_test.go)
	fConnKillLarge:  largeTxnFault(largeKill),
	fKafkaKillLarge: largeTxnFault(kafkaKill),
	fPGRestartLarge: largeTxnFault(largePGRestart),
}

// doFault injects one fault and undoes it; it returns a description.
func (r *run) doFault(ctx context.Context, kind string, f *faultRecord) (string, error) {
	do, ok := faultFuncs[kind]
	if !ok {
		return "", fmt.Errorf("unknown fault %q", kind)
	}
	return do(r, ctx, f)
}

func kafkaKill(r *run, ctx context.Context, _ *faultRecord) (string, error) {
	if err := env.kafka.Kill(); err != nil {
		return "", err
	}
	down := time.Duration(r.rng.Int64N(int64(2 * time.Second)))
	sleepCtx(ctx, down) // the outage under test
	return fmt.Sprintf("SIGKILL, down %v before restart", down.Round(time.Millisecond)), restartKafka(ctx)
}

func kafkaStop(_ *run, ctx context.Context, _ *faultRecord) (string, error) {
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	err := env.kafka.Stop(sctx)
	cancel()
	if err != nil {
		return "", err
	}
	sleepCtx(ctx, kafkaStopDowntime) // the outage under test
	return fmt.Sprintf("SIGTERM, down %v before restart", kafkaStopDowntime), restartKafka(ctx)
}

func restartKafka(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	return env.kafka.Restart(rctx)
}

// pgRestart stops PostgreSQL with stop and restarts it after up to a second.
func pgRestart(stop func(context.Context) error) faultFunc {
	return func(r *run, ctx context.Context, _ *faultRecord) (string, error) {
		if err := stop(ctx); err != nil {
			return "", err
		}
		down := time.Duration(r.rng.Int64N(int64(time.Second)))
		sleepCtx(ctx, down) // the outage under test
		return fmt.Sprintf("down %v before restart", down.Round(time.Millisecond)), restartPG(ctx)
	}
}

func pgRestoreUnderLoad(kind string) faultFunc {
	return func(r *run, ctx context.Context, f *faultRecord) (string, error) {
		return r.pgRestoreUnderLoad(ctx, kind, f)
	}
}

func txnFault(kind string) faultFunc {
	return func(r *run, ctx context.Context, _ *faultRecord) (string, error) { return r.txnFault(ctx, kind) }
}

func publicationGap(kind string) faultFunc {
	return func(r *run, ctx context.Context, f *faultRecord) (string, error) {
		return r.opsPublicationGap(ctx, f, kind)
	}
}

// ops counts an operations fault (r.opsN: unique names) before running it.
func ops(do faultFunc) faultFunc {
	return func(r *run, ctx context.Context, f *faultRecord) (string, error) {
		r.opsN++
		return do(r, ctx, f)
	}
}

// The proxies of the network faults, looked up when the fault runs (TestMain
// makes them).
func kafkaSide() *Proxy { return env.brokerProxy }
func pgSide() *Proxy    { return env.pgProxy }

// netFault runs do against the proxy side returns.
func netFault(side func() *Proxy, do func(r *run, ctx context.Context, p *Proxy) string) faultFunc {
	return func(r *run, ctx context.Context, _ *faultRecord) (string, error) { return do(r, ctx, side()), nil }
}

func netDrop(r *run, ctx context.Context, p *Proxy) string {
	d := r.between(time.Second, 4*time.Second)
	n := p.Drop()
	sleepCtx(ctx, d) // how long the cut lasts
	p.Heal()
	return fmt.Sprintf("closed %d connections, refused new ones for %v", n, d)
}

func netStall(r *run, ctx context.Context, p *Proxy) string {
	d := r.between(time.Second, 8*time.Second)
	p.Stall()
	sleepCtx(ctx, d) // how long the stall lasts
	n := p.Conns()
	p.Heal()
	return fmt.Sprintf("stalled %v (%d connections held)", d, n)
}

func netSlow(r *run, ctx context.Context, p *Proxy) string {
	lat := r.between(20*time.Millisecond, 200*time.Millisecond)
	d := r.between(2*time.Second, 6*time.Second)
	p.Slow(lat)
	sleepCtx(ctx, d) // how long the latency lasts
	p.Heal()
	return fmt.Sprintf("up to %v per chunk for %v", lat, d)
}

func netReset(r *run, ctx context.Context, p *Proxy) string {
	n := p.Reset()
	gap := r.between(50*time.Millisecond, 600*time.Millisecond)
	sleepCtx(ctx, gap) // the time between the two resets
	m := p.Reset()
	return fmt.Sprintf("RST %d connections, %v later %d more", n, gap, m)
}

// TestFaultTable: every kind has an injection, and every injection a kind.
func TestFaultTable(t *testing.T) {
	for _, k := range allFaults {
		if faultFuncs[k] == nil {
			t.Errorf("kind %s has no injection", k)
		}
	}
	if len(faultFuncs) != len(allFaults) {
		t.Errorf("%d injections for %d kinds", len(faultFuncs), len(allFaults))
	}
}
