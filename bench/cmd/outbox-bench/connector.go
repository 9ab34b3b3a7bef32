package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// connector is the real outbox-cdc binary running as its own process, so its
// memory (VmHWM) and CPU are its own. Its configuration is a YAML file with
// the contract's keys only.
type connector struct {
	*child
	base string // http://127.0.0.1:port
	http *http.Client
}

type connectorConfig struct {
	DSN, Slot string
	Brokers   []string
	Linger    time.Duration // kafka.linger; 0 is the default
	Topic     string        // kafka.topic; empty for the default template
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
kafka:
  brokers: [%s]
  topic: %s
  dlq_topic: %s
  linger: %s
%shttp:
  listen: %s
  pprof: true
log:
  level: warn
`, c.DSN, c.Slot, publication, outboxTable, strings.Join(c.Brokers, ", "), topic, dlqTopic, c.Linger, c.deliveryYAML(), listen)
	cfgPath := filepath.Join(e.workDir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(e.connectorBin, "run", "--config", cfgPath)
	cmd.Env = withoutConnectorEnv(os.Environ())
	ch, err := startChild(name, cmd, filepath.Join(e.workDir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("start connector: %w", err)
	}
	k := &connector{child: ch, base: "http://" + listen, http: &http.Client{Timeout: 5 * time.Second}}
	if err := k.waitReady(ctx); err != nil {
		k.kill()
		return nil, err
	}
	return k, nil
}

// deliveryYAML is the kafka block's delivery lines; none for the default.
func (c connectorConfig) deliveryYAML() string {
	if c.Delivery == "" || c.Delivery == atLeastOnce {
		return ""
	}
	return fmt.Sprintf("  delivery: %s\n  positions_topic: %s\n", c.Delivery, c.Positions)
}

// withoutConnectorEnv drops OUTBOX_CDC_* variables, which would override the
// file (an unknown one is even an error).
func withoutConnectorEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "OUTBOX_CDC_") {
			out = append(out, kv)
		}
	}
	return out
}

// waitReady polls /readyz (200 while the replication stream is up).
func (k *connector) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if k.exited() {
			return fmt.Errorf("connector %s exited during start-up (%v):\n%s", k.name, k.waitErr, k.logTail())
		}
		if k.get(ctx, "/readyz") == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("connector %s not ready: %w\n%s", k.name, ctx.Err(), k.logTail())
		case <-tick.C:
		}
	}
}

func (k *connector) get(ctx context.Context, path string) error {
	_, err := k.fetch(ctx, path)
	return err
}

func (k *connector) fetch(ctx context.Context, path string) ([]byte, error) {
	return httpGet(ctx, k.http, k.base+path)
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
func (k *connector) scrape(ctx context.Context) (promSamples, error) {
	b, err := k.fetch(ctx, "/metrics")
	if err != nil {
		return promSamples{}, fmt.Errorf("connector %s metrics: %w", k.name, err)
	}
	return parseProm(b), nil
}

// waitDelivered polls /metrics until published + dead-lettered reaches n and
// returns when it saw it. Resolution is the poll interval.
func (k *connector) waitDelivered(ctx context.Context, n int64, every time.Duration, log *slog.Logger) (time.Time, promSamples, error) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	progress := time.Now()
	for {
		if time.Since(progress) >= 10*time.Second {
			progress = time.Now()
			s, _ := k.scrape(ctx)
			log.Info("draining", "delivered", s.delivered(), "of", n, "seconds", round(time.Since(k.started).Seconds(), 1))
		}
		if k.exited() {
			return time.Time{}, promSamples{}, fmt.Errorf("connector %s exited (%v):\n%s", k.name, k.waitErr, k.logTail())
		}
		s, err := k.scrape(ctx)
		now := time.Now()
		if err == nil && s.delivered() >= n {
			return now, s, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, s, fmt.Errorf("connector %s delivered %d of %d events: %w", k.name, s.delivered(), n, ctx.Err())
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM (stop reading, drain, confirm) and requires exit code 0.
func (k *connector) stop(ctx context.Context) error {
	if k.exited() {
		return fmt.Errorf("connector %s had exited (%v):\n%s", k.name, k.waitErr, k.logTail())
	}
	if err := k.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 45*time.Second)
	defer cancel()
	select {
	case <-k.done:
	case <-ctx.Done():
		k.kill()
		return fmt.Errorf("connector %s did not stop within 45s of SIGTERM:\n%s", k.name, k.logTail())
	}
	if k.waitErr != nil {
		return fmt.Errorf("connector %s: %w:\n%s", k.name, k.waitErr, k.logTail())
	}
	return nil
}

// errLost marks a scenario that did not deliver every event.
var errLost = errors.New("events lost")
