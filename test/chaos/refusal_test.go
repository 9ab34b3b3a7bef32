package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The start after a rewind (restore_test.go): a saved position the
// restored or promoted server's history lacks is refused, for good, with
// the fix in the message (docs/operations.md, "Restores"); the suite is the
// operator who applies it and starts the connector again.

var (
	// wantKafkaNotInHistory: exactly_once refuses a committed position
	// whose history mark the server lacks (pipeline refuseStart); the fix
	// names the positions topic and the key of the tombstone.
	wantKafkaNotInHistory = regexp.MustCompile(`the kafka position \S+ is not in this server's history: the server lacks history mark \d+.*?--topic (\S+) .*?<<< '([^']+)\|NULL'`)
	// wantCkptNotInHistory: a checkpoint whose history mark the server
	// lacks; the fix drops it (a statement for the table store, the path
	// for the file store).
	wantCkptNotInHistory = regexp.MustCompile(`the checkpoint position \S+ is not in this server's history: the server lacks history mark \d+`)
	removeFile           = regexp.MustCompile(`remove the file (\S+?) \(docs/operations\.md`)
	// wantRefusal is any of the start's refusals of a saved position.
	wantRefusal = regexp.MustCompile(wantCommittedRefused.String() + "|" + wantKafkaNotInHistory.String() + "|" + wantCkptNotInHistory.String())
)

// maxRefusals bounds the refused starts of one runbook: the checkpoint,
// then the position committed to Kafka.
const maxRefusals = 2

// launchAfterRewind is the rest of afterRewind: the runbook. It starts the
// connector and answers each refused start as its message says. In the
// exactly_once run the start must refuse the position committed to Kafka
// when the connector had committed past the server's end (must).
func (r *run) launchAfterRewind(ctx context.Context, f *faultRecord, kind, reason string, must bool, desc string) (string, error) {
	kafkaRefused := false
	var next *incarnation
	for i := 0; ; i++ {
		var err error
		if next, err = r.conn.launch(ctx, reason); err != nil {
			return desc, err
		}
		f.restarted = next.Start
		if i == maxRefusals {
			break
		}
		var what string
		if what, desc, err = r.refusal(ctx, kind, next, desc); err != nil {
			return desc, err
		}
		if what == "" {
			break
		}
		kafkaRefused = kafkaRefused || what == "kafka"
	}
	if exactlyOnce() && must && !kafkaRefused {
		r.opsFailed(kind, "connector #%d started on the position committed to Kafka although the server does not hold it", next.N)
	}
	if err := r.conn.waitReady(ctx, next, time.Minute); err != nil {
		return desc, fmt.Errorf("restart after the rewind: %w", err)
	}
	next.Ready = time.Now()
	desc += fmt.Sprintf("; #%d ready in %v", next.N, next.Ready.Sub(next.Start).Round(time.Millisecond))
	return desc + r.repairIfPrinted(ctx, kind, f.Rewound), nil
}

// refusal waits until in is ready ("") or exits refusing a saved position,
// and applies the fix: a position committed to Kafka ("kafka") is
// forgotten with the tombstone for the key the message names (the suite's
// kgo client, not the shell line); a checkpoint ("checkpoint") is dropped.
// The table store is restored with the data and its mark, and is written
// only in the server's history (replication TableStore): a refused table
// checkpoint is an operations failure, dropped so that the run goes on.
func (r *run) refusal(ctx context.Context, kind string, in *incarnation, desc string) (string, string, error) {
	ready := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { ready <- r.conn.waitReady(rctx, in, time.Minute) }()
	select {
	case <-in.done:
	case err := <-ready:
		if err == nil {
			return "", desc + fmt.Sprintf("; #%d started", in.N), nil
		}
	}
	took, line, exitErr := r.conn.expectExit(ctx, in, in.Start, time.Second, wantRefusal)
	if exitErr != nil {
		r.opsFailed(kind, "%v", exitErr)
		return "", desc + "; " + exitErr.Error(), fmt.Errorf("start after the rewind: %w", exitErr)
	}
	r.expectedExits = append(r.expectedExits, fmt.Sprintf("%s: #%d exit 1 after %v: %s", kind, in.N, took.Round(time.Millisecond), strings.TrimSpace(line)))
	if wantCkptNotInHistory.MatchString(line) {
		how, err := r.forgetCheckpoint(ctx, line)
		if err != nil {
			return "", desc, err
		}
		if !removeFile.MatchString(line) {
			r.opsFailed(kind, "connector #%d refused the table checkpoint, which a restore restores with its history mark: %s", in.N, strings.TrimSpace(line))
		}
		return "checkpoint", desc + fmt.Sprintf("; #%d refused the checkpoint (history mark missing): %s", in.N, how), nil
	}
	topic, key, why := committedRefusal(line)
	if err := tombstone(ctx, topic, key); err != nil {
		return "", desc, err
	}
	return "kafka", desc + fmt.Sprintf("; #%d refused the committed position (%s); tombstone for %s on %s", in.N, why, key, topic), nil
}

// committedRefusal reads the positions topic, the key and the reason from
// a refusal of the position committed to Kafka.
func committedRefusal(line string) (topic, key, why string) {
	if m := wantCommittedRefused.FindStringSubmatch(line); m != nil {
		return m[1], m[2], m[3]
	}
	m := wantKafkaNotInHistory.FindStringSubmatch(line)
	return m[1], m[2], "its history mark is missing"
}

// forgetCheckpoint drops the refused checkpoint as the message says: the
// file it names, or the slot's row of the table store (the suite's own
// statement: the printed one is quoted in the log line).
func (r *run) forgetCheckpoint(ctx context.Context, line string) (string, error) {
	if m := removeFile.FindStringSubmatch(line); m != nil {
		if err := os.Remove(m[1]); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		return "removed " + m[1], nil
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, direct(r.dsn))
	if err != nil {
		return "", fmt.Errorf("drop the checkpoint: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(cctx, "DELETE FROM "+ckptTable+" WHERE slot = $1", r.conn.slot); err != nil {
		return "", fmt.Errorf("drop the checkpoint: %w", err)
	}
	return "DELETE FROM " + ckptTable, nil
}

// tombstone forgets a committed position, as the refusal's fix says, with
// the suite's own client (the shell command it prints does the same).
func tombstone(ctx context.Context, topic, key string) error {
	cl, err := newKafkaClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(pctx, &kgo.Record{Topic: topic, Key: []byte(key)}).FirstErr(); err != nil {
		return fmt.Errorf("tombstone for %s on %s: %w", key, topic, err)
	}
	return nil
}
