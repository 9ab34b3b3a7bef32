package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

// connector is the real outbox-cdc binary running as its own process, so its
// memory (VmHWM) and CPU are its own. Its configuration is a YAML file with
// the contract's keys only.
type connector struct {
	*child
	addr string // 127.0.0.1:port, its HTTP listener
}

type connectorConfig struct {
	DSN, Slot string
	Brokers   []string
	// Fixed: kafka.linger is Linger and the budget is off; else Budget > 0
	// is kafka.latency_budget, and 0 leaves both keys at their defaults.
	Fixed  bool
	Linger time.Duration
	Budget time.Duration
	// Retention is outbox.retention (0: off), its rounds every second.
	Retention time.Duration
	Topic     string // kafka.topic; empty for the default template
	// Delivery is kafka.delivery ("" for the default); with exactly_once,
	// Positions is kafka.positions_topic (each run its own).
	Delivery, Positions string
}

func (e *env) startConnector(ctx context.Context, name string, c connectorConfig) (*connector, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	listen := "127.0.0.1:" + strconv.Itoa(port)
	topic := c.Topic
	if topic == "" {
		topic = "outbox.event.{aggregate_type}"
	}
	yaml := fmt.Sprintf(`# written by outbox-bench
postgres:
  dsn: %q
  slot: %s
  publication: %s
outbox:
  table: %s
%skafka:
  brokers: [%s]
  topic: %s
  dlq_topic: %s
%s%shttp:
  listen: %s
  pprof: true
log:
  level: warn
`, c.DSN, c.Slot, publication, outboxTable, c.retentionYAML(), strings.Join(c.Brokers, ", "), topic, dlqTopic, c.batchingYAML(), c.deliveryYAML(), listen)
	cfgPath := filepath.Join(e.workDir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	cmd := cdctest.Command(e.connectorBin, nil, "run", "--config", cfgPath)
	ch, err := startChild(name, cmd, filepath.Join(e.workDir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("start connector: %w", err)
	}
	k := &connector{child: ch, addr: listen}
	if err := k.waitReady(ctx); err != nil {
		_ = k.Kill()
		return nil, err
	}
	return k, nil
}

// deliveryYAML is the kafka block's delivery lines; none for the default.
// retentionYAML is the outbox keys that turn retention on: none when off.
func (c connectorConfig) retentionYAML() string {
	if c.Retention <= 0 {
		return ""
	}
	return fmt.Sprintf("  retention: %s\n  retention_interval: 1s\n", c.Retention)
}

// batchingYAML is the kafka keys that decide how records wait for a produce
// request: none for the defaults.
func (c connectorConfig) batchingYAML() string {
	switch {
	case c.Fixed:
		return fmt.Sprintf("  linger: %s\n  latency_budget: 0s\n", c.Linger)
	case c.Budget > 0:
		return fmt.Sprintf("  latency_budget: %s\n", c.Budget)
	}
	return ""
}

func (c connectorConfig) deliveryYAML() string {
	if c.Delivery == "" || c.Delivery == atLeastOnce {
		return ""
	}
	return fmt.Sprintf("  delivery: %s\n  positions_topic: %s\n", c.Delivery, c.Positions)
}

// waitReady polls /readyz (200 while the replication stream is up).
func (k *connector) waitReady(ctx context.Context) error {
	err := k.WaitOK(ctx, k.addr, "/readyz", time.Minute)
	switch {
	case errors.Is(err, cdctest.ErrExited):
		return fmt.Errorf("connector %s exited during start-up (%v):\n%s", k.Name, k.Err(), k.LogTail(tailLines))
	case err != nil:
		return fmt.Errorf("connector %s not ready: %w\n%s", k.Name, err, k.LogTail(tailLines))
	}
	return nil
}

// httpGet returns the body of a 200 answer to GET url.
func httpGet(ctx context.Context, hc *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, nil
}

// scrape reads /metrics.
func (k *connector) scrape(ctx context.Context) (cdctest.Metrics, error) {
	m, err := cdctest.Scrape(ctx, k.addr)
	if err != nil {
		return cdctest.Metrics{}, fmt.Errorf("connector %s: %w", k.Name, err)
	}
	return m, nil
}

// waitDelivered polls /metrics until published + dead-lettered reaches n and
// returns when it saw it. Resolution is the poll interval.
func (k *connector) waitDelivered(ctx context.Context, n int64, every time.Duration, log *slog.Logger) (time.Time, cdctest.Metrics, error) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	progress := time.Now()
	for {
		if time.Since(progress) >= 10*time.Second {
			progress = time.Now()
			s, _ := k.scrape(ctx)
			log.Info("draining", "delivered", delivered(s), "of", n, "seconds", round(time.Since(k.Started).Seconds(), 1))
		}
		if k.Exited() {
			return time.Time{}, cdctest.Metrics{}, fmt.Errorf("connector %s exited (%v):\n%s", k.Name, k.Err(), k.LogTail(tailLines))
		}
		s, err := k.scrape(ctx)
		now := time.Now()
		if err == nil && delivered(s) >= n {
			return now, s, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, s, fmt.Errorf("connector %s delivered %d of %d events: %w", k.Name, delivered(s), n, ctx.Err())
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM (stop reading, drain, confirm) and requires exit code 0.
func (k *connector) stop(ctx context.Context) error {
	if err := k.Stop(45 * time.Second); err != nil {
		return fmt.Errorf("connector %w:\n%s", err, k.LogTail(tailLines))
	}
	return nil
}

// errLost marks a scenario that did not deliver every event.
var errLost = errors.New("events lost")
