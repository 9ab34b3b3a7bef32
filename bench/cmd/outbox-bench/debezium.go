package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// Debezium is the contender users weigh outbox-cdc against: its PostgreSQL
// connector with the Outbox EventRouter on Kafka Connect standalone, on its
// own slot and publication, producing to the same broker. The jars come from
// scripts/fetch-debezium.sh; when they cannot be fetched the benchmark runs
// without Debezium and the report says why.

const (
	// dbzPublication is Debezium's own publication (created with the schema,
	// before any slot, like the connector's).
	dbzPublication = "debezium_bench"
	// envDebeziumLibs overrides where the jars are (as in the fetch script).
	envDebeziumLibs = "OUTBOX_BENCH_DEBEZIUM_LIBS"
)

// debeziumLibs fetches the jars if needed and returns their directory, or
// an error saying why Debezium cannot run.
func debeziumLibs(ctx context.Context) (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	if _, err := exec.LookPath("java"); err != nil {
		return "", errors.New("java not found (apt-get install openjdk-17-jre-headless)")
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(fctx, filepath.Join(root, "scripts", "fetch-debezium.sh"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("scripts/fetch-debezium.sh: %w: %s", err, lastLine(string(out)))
	}
	libs := os.Getenv(envDebeziumLibs)
	if libs == "" {
		libs = filepath.Join(root, ".cache", "debezium", "libs")
	}
	if _, err := os.Stat(filepath.Join(libs, ".complete")); err != nil {
		return "", fmt.Errorf("debezium jars: %w", err)
	}
	return libs, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// debezium is one Kafka Connect standalone worker running the connector.
type debezium struct {
	*child
	rest string // http://127.0.0.1:port
	conn string // the connector's name in Connect
}

// dbzTopic turns the connector's topic template into the EventRouter's.
func dbzTopic(template string) string {
	return strings.ReplaceAll(template, "{aggregate_type}", "${routedByValue}")
}

// startDebezium starts Connect on an existing slot (snapshot.mode=no_data:
// stream from the slot's position, as the connector does) and waits until
// its task runs.
func (e *env) startDebezium(ctx context.Context, name, slot, topicTemplate string) (*debezium, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	rest := "127.0.0.1:" + strconv.Itoa(port)
	dir := filepath.Join(e.workDir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// The producer is left at the Kafka client's defaults except for the
	// guarantees the connector also gives (acks=all, idempotence): that is
	// what a Debezium user runs.
	worker := fmt.Sprintf(`bootstrap.servers=%s
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
offset.storage.file.filename=%s
offset.flush.interval.ms=1000
listeners=http://%s
producer.acks=all
producer.enable.idempotence=true
`, strings.Join(e.brokers, ","), filepath.Join(dir, "offsets"), rest)
	// The EventRouter equivalent of the connector's defaults: key
	// aggregate_id, value payload as is, topic from aggregate_type, headers
	// id, event_type and aggregate_type.
	conn := "outbox-" + name
	connector := fmt.Sprintf(`name=%s
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname=127.0.0.1
database.port=%d
database.user=postgres
database.dbname=%s
topic.prefix=bench_dbz
plugin.name=pgoutput
slot.name=%s
publication.name=%s
publication.autocreate.mode=disabled
snapshot.mode=no_data
table.include.list=%s
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.table.field.event.id=id
transforms.outbox.table.field.event.key=aggregate_id
transforms.outbox.table.field.event.payload=payload
transforms.outbox.route.by.field=aggregate_type
transforms.outbox.route.topic.replacement=%s
transforms.outbox.table.fields.additional.placement=event_type:header:event_type,aggregate_type:header:aggregate_type
`, conn, e.pg.Port(), database, slot, dbzPublication, outboxTable, dbzTopic(topicTemplate))
	log4j := "rootLogger.level=INFO\nrootLogger.appenderRef.stdout.ref=STDOUT\n" +
		"appender.stdout.type=Console\nappender.stdout.name=STDOUT\nappender.stdout.layout.type=PatternLayout\n" +
		"appender.stdout.layout.pattern=[%d] %p %m (%c)%n\n"
	files := map[string]string{"worker.properties": worker, "connector.properties": connector, "log4j2.properties": log4j}
	for f, body := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(body), 0o600); err != nil {
			return nil, err
		}
	}
	// The heap of bin/connect-standalone.sh.
	cmd := exec.Command("java", "-Xms256M", "-Xmx2G",
		"-Dlog4j2.configurationFile="+filepath.Join(dir, "log4j2.properties"),
		"-cp", filepath.Join(e.debeziumLibs, "*"),
		"org.apache.kafka.connect.cli.ConnectStandalone",
		filepath.Join(dir, "worker.properties"), filepath.Join(dir, "connector.properties"))
	ch, err := startChild(name, cmd, filepath.Join(dir, "connect.log"))
	if err != nil {
		return nil, fmt.Errorf("start debezium: %w", err)
	}
	d := &debezium{child: ch, rest: "http://" + rest, conn: conn}
	if err := d.waitRunning(ctx, e, slot); err != nil {
		d.Kill()
		return nil, err
	}
	return d, nil
}

// connectStatus is GET /connectors/NAME/status.
type connectStatus struct {
	Connector struct {
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"connector"`
	Tasks []struct {
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"tasks"`
}

// waitRunning waits until the task runs and holds the slot (its walsender
// is then there to account CPU to).
func (d *debezium) waitRunning(ctx context.Context, e *env, slot string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	hc := &http.Client{Timeout: 5 * time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := "no answer"
	for {
		if d.Exited() {
			return fmt.Errorf("debezium %s exited during start-up (%v):\n%s", d.Name, d.Err(), d.LogTail(tailLines))
		}
		st, err := d.status(ctx, hc)
		switch {
		case err != nil:
			last = err.Error()
		case st.Connector.State == "FAILED":
			return fmt.Errorf("debezium %s failed: %s", d.Name, firstLines(st.Connector.Trace, 3))
		case len(st.Tasks) > 0 && st.Tasks[0].State == "FAILED":
			return fmt.Errorf("debezium %s task failed: %s", d.Name, firstLines(st.Tasks[0].Trace, 3))
		case len(st.Tasks) > 0 && st.Tasks[0].State == "RUNNING" && e.slotPID(ctx, slot) != 0:
			return nil
		default:
			last = "connector " + st.Connector.State
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("debezium %s not streaming (%s): %w\n%s", d.Name, last, ctx.Err(), d.LogTail(tailLines))
		case <-tick.C:
		}
	}
}

func (d *debezium) status(ctx context.Context, hc *http.Client) (connectStatus, error) {
	var st connectStatus
	b, err := httpGet(ctx, hc, d.rest+"/connectors/"+d.conn+"/status")
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

func firstLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[:min(n, len(lines))], " ")
}

// dbzCarrier is Debezium carrying a steady run on its own slot.
type dbzCarrier struct {
	e         *env
	d         *debezium
	slot      string
	walsender int
	closed    bool
}

func (e *env) startDebeziumCarrier(ctx context.Context, aggType string) (carrier, error) {
	slot := "dbz_" + aggType
	if _, err := e.createSlot(ctx, slot); err != nil {
		return nil, err
	}
	d, err := e.startDebezium(ctx, slot, slot, "outbox.event.{aggregate_type}")
	if err != nil {
		e.dropSlots(ctx, slot)
		return nil, err
	}
	return &dbzCarrier{e: e, d: d, slot: slot, walsender: e.slotPID(ctx, slot)}, nil
}

func (c *dbzCarrier) account(p *cpuProbe) { p.clientPID, p.pathPID = c.d.Pid(), c.walsender }

func (c *dbzCarrier) mark(context.Context) error { return nil }

func (c *dbzCarrier) failed() error {
	if c.d.Exited() {
		return fmt.Errorf("debezium exited (%v):\n%s", c.d.Err(), c.d.LogTail(tailLines))
	}
	return nil
}

func (c *dbzCarrier) finish(_ context.Context, res *SteadyResult) error {
	if err := c.failed(); err != nil {
		return err
	}
	var err error
	res.PeakRSSBytes, _, err = c.d.Memory()
	c.close()
	return err
}

// close kills the worker: its offsets do not matter once the run is over.
func (c *dbzCarrier) close() {
	if c.closed {
		return
	}
	c.closed = true
	c.d.Kill()
	c.e.dropSlots(context.Background(), c.slot)
}
