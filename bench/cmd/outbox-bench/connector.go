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
	name    string
	cmd     *exec.Cmd
	logPath string
	base    string // http://127.0.0.1:port
	started time.Time
	http    *http.Client
	done    chan struct{} // closed when the process has exited
	waitErr error
}

type connectorConfig struct {
	DSN, Slot string
	Brokers   []string
	Linger    time.Duration // kafka.linger; 0 is the default
	Topic     string        // kafka.topic; empty for the default template
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
http:
  listen: %s
log:
  level: warn
`, c.DSN, c.Slot, publication, outboxTable, strings.Join(c.Brokers, ", "), topic, dlqTopic, c.Linger, listen)
	cfgPath := filepath.Join(e.workDir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(e.workDir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(e.connectorBin, "run", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = withoutConnectorEnv(os.Environ())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	k := &connector{name: name, cmd: cmd, logPath: logPath, base: "http://" + listen,
		http: &http.Client{Timeout: 5 * time.Second}, done: make(chan struct{})}
	k.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start connector %s: %w", name, err)
	}
	go func() {
		k.waitErr = cmd.Wait()
		close(k.done)
	}()
	if err := k.waitReady(ctx); err != nil {
		k.kill()
		return nil, err
	}
	return k, nil
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

func (k *connector) pid() int { return k.cmd.Process.Pid }

func (k *connector) exited() bool {
	select {
	case <-k.done:
		return true
	default:
		return false
	}
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.base+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := k.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", path, resp.Status)
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

// memory returns VmHWM (peak resident set) and VmRSS in bytes.
func (k *connector) memory() (hwm, rss int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", k.pid()))
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		switch key {
		case "VmHWM":
			hwm = kb << 10
		case "VmRSS":
			rss = kb << 10
		}
	}
	if hwm == 0 {
		return 0, 0, fmt.Errorf("no VmHWM in /proc/%d/status", k.pid())
	}
	return hwm, rss, nil
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

// kill ends the process at once and waits for it.
func (k *connector) kill() {
	if !k.exited() {
		_ = k.cmd.Process.Kill()
	}
	<-k.done
}

func (k *connector) logTail() string {
	b, err := os.ReadFile(k.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// errLost marks a scenario that did not deliver every event.
var errLost = errors.New("events lost")
