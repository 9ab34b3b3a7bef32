package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestGapRepairAtLeastOnceReplaysAfterConfirmed: in at_least_once too, a gap
// repair publishes again only rows the slot had not confirmed, so its
// copies are a replayed tail in the original order (contract, guarantee 4:
// duplicates only after the last confirmed position). A transaction that
// took an id before the rows holds the gap's xmin bound below all of them,
// so the repair reads rows delivered and confirmed long before the gap;
// the slot must not have passed them. The chaos run (long seed
// 10167240380432169663, 2026-12-07) saw the repair publish such rows after
// the stream had replayed newer ones: 19 keys whose replay jumped ahead.
func TestGapRepairAtLeastOnceReplaysAfterConfirmed(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot = "gaporder"
	cfgPath := writeConfig(t, yamlFor(t, dsn, slot, "outbox: {table: public.outbox}"))
	conn := pgConnect(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	row, _ := gapWriters(ctx, t, slot)
	addr := freeAddr(t)
	p := startProc(t, cfgPath, addr, true, "OUTBOX_CDC_HTTP_LISTEN="+addr) // before: creating the slot waits for it
	long := beginLong(ctx, t, dsn, slot, 9, 0)
	long.takeID()                // below every row's id: the gap's bound stays below them
	ends := map[string]lsn.LSN{} // each row's commit is before this position
	write := func(name string) {
		committed(t, conn, func(tx pgx.Tx) { row(tx, name) })
		ends[name] = currentLSN(t, conn)
	}
	for i := 1; i <= 40; i++ {
		write(fmt.Sprintf("r%d", i))
	}
	consumeUntilValue(t, topicFor(slot), `{"n": "r40"}`, time.Minute)
	stopClean(t, p)
	confirmed := slotConfirmed(t, dsn, slot)

	// A change while stopped: rows written meanwhile are never decoded.
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	for i := 1; i <= 3; i++ {
		write(fmt.Sprintf("g%d", i))
	}
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")
	addr = freeAddr(t)
	p2 := startProc(t, cfgPath, addr, true, "OUTBOX_CDC_HTTP_LISTEN="+addr)
	defer func() {
		if t.Failed() {
			t.Logf("after the change:\n%s", p2.output())
		}
	}()
	long.commit() // the repair waits for what was open when it began
	write("last")
	got := consumeUntilValue(t, topicFor(slot), `{"n": "last"}`, time.Minute)
	stopClean(t, p2)

	count := map[string]int{}
	var problems, seq []string
	for _, r := range got {
		name := strings.TrimSuffix(strings.TrimPrefix(string(r.Value), `{"n": "`), `"}`)
		count[name]++
		seq = append(seq, name)
	}
	for name, end := range ends {
		switch n := count[name]; {
		case n == 0:
			problems = append(problems, name+" missing")
		case n > 1 && end <= confirmed:
			problems = append(problems, fmt.Sprintf("%s committed below the confirmed position %v, published %d times", name, confirmed, n))
		}
	}
	if len(problems) > 0 {
		t.Fatalf("%s\nread (key g, one partition): %s", strings.Join(problems, "; "), strings.Join(seq, " "))
	}
}
