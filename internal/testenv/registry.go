package testenv

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EnvApicurioDir names a directory holding the unpacked Apicurio Registry
// app to use instead of <repo root>/.cache/apicurio/<version>;
// scripts/fetch-apicurio.sh fills it too.
const EnvApicurioDir = "OUTBOX_CDC_APICURIO_DIR"

// registryAPI is the path of Apicurio's Confluent-compatible API.
const registryAPI = "/apis/ccompat/v7"

// Registry is an Apicurio Registry (in-memory storage) serving the
// Confluent schema registry API, started by StartRegistry. Its data lives
// as long as the process: Stop loses every schema. Safe for concurrent use.
type Registry struct {
	java    string
	jar     string
	baseDir string
	logPath string
	port    int
	version string

	mu   sync.Mutex
	proc *process
}

// StartRegistry starts Apicurio Registry on a free loopback port and
// returns once its Confluent API lists subjects. The app comes from
// $OUTBOX_CDC_APICURIO_DIR or is fetched with scripts/fetch-apicurio.sh.
func StartRegistry(ctx context.Context) (*Registry, error) {
	r := &Registry{}
	if err := r.init(ctx); err != nil {
		r.Close()
		return nil, fmt.Errorf("start registry: %w", err)
	}
	return r, nil
}

func (r *Registry) init(ctx context.Context) error {
	var err error
	if r.java, err = findJava(); err != nil {
		return err
	}
	dir, err := apicurioApp(ctx)
	if err != nil {
		return err
	}
	r.version, _ = readStamp(dir)
	if r.jar, err = apicurioJar(dir); err != nil {
		return err
	}
	if r.baseDir, err = os.MkdirTemp("", "outbox-registry-"); err != nil {
		return err
	}
	r.logPath = filepath.Join(r.baseDir, "registry.log")
	if r.port, err = FreePort(); err != nil {
		return err
	}
	return r.start(ctx)
}

// apicurioApp returns the directory of the unpacked app: one named by
// $OUTBOX_CDC_APICURIO_DIR that is complete is used as is; otherwise
// scripts/fetch-apicurio.sh runs (milliseconds when cached) and prints it.
func apicurioApp(ctx context.Context) (string, error) {
	dir := os.Getenv(EnvApicurioDir)
	if _, ok := readStamp(dir); dir != "" && ok {
		return dir, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("apicurio: %w (set %s to the unpacked app)", err, EnvApicurioDir)
	}
	script := filepath.Join(root, "scripts", "fetch-apicurio.sh")
	cmd := exec.CommandContext(ctx, "bash", script)
	if dir != "" {
		cmd.Env = append(os.Environ(), EnvApicurioDir+"="+dir)
	}
	var stderr strings.Builder // the script says what to install when Maven or Java is missing
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("apicurio: %s: %w\n%s", script, err, tail(stderr.String(), 30))
	}
	dir = strings.TrimSpace(string(out))
	if _, ok := readStamp(dir); !ok {
		return "", fmt.Errorf("apicurio: %s left no .complete stamp in %q", script, dir)
	}
	return dir, nil
}

// apicurioJar finds the launcher: 3.0.x is a Quarkus legacy jar
// (*-runner.jar beside lib/), later releases a fast-jar (quarkus-run.jar).
func apicurioJar(dir string) (string, error) {
	if p := filepath.Join(dir, "quarkus-run.jar"); fileExists(p) {
		return p, nil
	}
	m, _ := filepath.Glob(filepath.Join(dir, "*-runner.jar"))
	if len(m) != 1 {
		return "", fmt.Errorf("apicurio: want one *-runner.jar or quarkus-run.jar in %s, found %v", dir, m)
	}
	return m[0], nil
}

func (r *Registry) start(ctx context.Context) error {
	cmd := exec.Command(r.java,
		"-Xms64m", "-Xmx512m",
		// C1 only: the registry serves a handful of test requests, and
		// the C2 compiler's warm-up is most of the start on 2 cores.
		"-XX:TieredStopAtLevel=1",
		"-XX:-UsePerfData", "-XX:+ExitOnOutOfMemoryError",
		"-Dquarkus.http.host=127.0.0.1",
		"-Dquarkus.http.port="+strconv.Itoa(r.port),
		"-jar", r.jar)
	cmd.Dir = r.baseDir
	return startReady(ctx, "apicurio registry", cmd, r.logPath, func(p *process) { r.proc = p }, r.waitReady)
}

// waitReady polls the Confluent API's subject list: it answers only once
// the storage is up, which the HTTP port alone does not say.
func (r *Registry) waitReady(ctx context.Context) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	url := r.URL() + "/subjects"
	for {
		if r.proc.exited() {
			return fmt.Errorf("apicurio registry exited during startup: %v", r.proc.err)
		}
		err := probeHTTP(ctx, hc, url)
		if err == nil {
			return nil
		}
		if serr := sleepCtx(ctx, 100*time.Millisecond); serr != nil {
			return fmt.Errorf("apicurio registry not ready: %w (last error: %v)", serr, err)
		}
	}
}

func probeHTTP(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// URL is the base of the Confluent-compatible API,
// http://127.0.0.1:<port>/apis/ccompat/v7.
func (r *Registry) URL() string {
	return "http://127.0.0.1:" + strconv.Itoa(r.port) + registryAPI
}

// LogFile is the registry process's output.
func (r *Registry) LogFile() string { return r.logPath }

// Version is the Apicurio Registry version that runs.
func (r *Registry) Version() string { return r.version }

// Running reports whether the registry process is up.
func (r *Registry) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc != nil && !r.proc.exited()
}

// Stop sends SIGTERM (Quarkus shuts down in order) and waits for the
// process to exit; if ctx ends first it is killed. The registry's schemas
// are gone: it keeps them in memory.
func (r *Registry) Stop(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return nil
	}
	if err := r.proc.stop(ctx, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop registry: %w", err)
	}
	return nil
}

// Close stops the registry if it runs and removes its directory, log
// included.
func (r *Registry) Close() error {
	ctx, cancel := detachedContext(60 * time.Second)
	defer cancel()
	err := r.Stop(ctx)
	if r.baseDir != "" {
		if rerr := os.RemoveAll(r.baseDir); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}
