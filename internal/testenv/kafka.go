package testenv

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Environment variables understood by StartKafka.
const (
	// EnvKafkaLibs names a directory of Kafka broker jars to use instead of
	// <repo root>/.cache/kafka/libs. scripts/fetch-kafka.sh fills it too.
	EnvKafkaLibs = "OUTBOX_CDC_KAFKA_LIBS"
	// EnvKafkaBrokers makes StartKafka use existing brokers (comma list).
	EnvKafkaBrokers = "OUTBOX_CDC_TEST_KAFKA_BROKERS"
)

const kafkaInstallHint = "apt-get install openjdk-17-jre-headless maven"

// KafkaOptions configures StartKafka.
type KafkaOptions struct {
	// Properties are server.properties entries added to, or overriding, the
	// harness defaults.
	Properties map[string]string
	// Security, when set, adds a SASL_SSL listener (see SecureBrokers). The
	// PLAINTEXT listener stays for the harness and for Brokers.
	Security *KafkaSecurity
	// OAuthBearer, when set, adds an OAUTHBEARER listener (see
	// OAuthBrokers); ignored for external brokers.
	OAuthBearer *KafkaOAuthBearer
}

// KafkaSecurity configures the SASL_SSL listener of a managed broker.
type KafkaSecurity struct {
	// CertPEM is the broker's certificate (chain); it must be valid for
	// 127.0.0.1, the advertised host (TestCA.ServerCert's default is).
	CertPEM []byte
	// KeyPEM is its unencrypted private key (PKCS#8, PKCS#1 or SEC 1).
	KeyPEM []byte
	// SCRAMUsers maps user names to passwords. Each user can authenticate
	// with SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN. SCRAM credentials are
	// written into the cluster metadata at format time as salted hashes;
	// the PLAIN passwords are in the broker's (0600) server.properties.
	// Names are [A-Za-z0-9._-]; passwords must not contain '"', '\' or
	// control characters.
	SCRAMUsers map[string]string
}

// SASL mechanisms enabled on the SASL_SSL listener.
var kafkaSASLMechanisms = []string{"SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"}

// scramIterations is the SCRAM iteration count of the harness's users
// (Kafka's minimum, which keeps authentication cheap).
const scramIterations = 4096

// Kafka is a single-node KRaft Kafka cluster (combined broker and
// controller) started by StartKafka. Its methods are safe for concurrent use.
type Kafka struct {
	external []string // brokers of an external cluster; nil when managed

	java     string
	libDir   string
	baseDir  string
	dataDir  string // log.dirs
	confPath string
	log4j    string
	logPath  string
	port     int
	ctrlPort int
	version  string

	security   *KafkaSecurity // nil: no SASL_SSL listener
	securePort int
	keystore   string // PEM key and certificate chain of the SASL_SSL listener

	oauth     *KafkaOAuthBearer // nil: no OAUTH listener
	oauthPort int

	closing closeSignal // ends an in-flight Restart when Close is called
	mu      sync.Mutex
	proc    *process
}

// StartKafka formats a fresh KRaft log directory and starts a combined
// broker/controller on free loopback ports, returning once the broker serves
// metadata and can create a topic. Broker jars come from
// $OUTBOX_CDC_KAFKA_LIBS or are fetched with scripts/fetch-kafka.sh. If
// OUTBOX_CDC_TEST_KAFKA_BROKERS is set it returns a handle to those brokers.
func StartKafka(ctx context.Context, opts KafkaOptions) (*Kafka, error) {
	if list := os.Getenv(EnvKafkaBrokers); list != "" {
		if opts.Security != nil {
			return nil, fmt.Errorf("start kafka: a SASL_SSL listener needs a managed broker, but %s is set: %w", EnvKafkaBrokers, ErrExternal)
		}
		return startExternalKafka(ctx, list)
	}
	if err := opts.Security.check(); err != nil {
		return nil, fmt.Errorf("start kafka: %w", err)
	}
	k := &Kafka{closing: newCloseSignal()}
	if err := k.init(ctx, opts); err != nil {
		k.Close()
		return nil, fmt.Errorf("start kafka: %w", err)
	}
	return k, nil
}

func startExternalKafka(ctx context.Context, list string) (*Kafka, error) {
	k := &Kafka{}
	for b := range strings.SplitSeq(list, ",") {
		if b = strings.TrimSpace(b); b != "" {
			k.external = append(k.external, b)
		}
	}
	if len(k.external) == 0 {
		return nil, fmt.Errorf("start kafka: %s has no brokers", EnvKafkaBrokers)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.external...))
	if err != nil {
		return nil, fmt.Errorf("start kafka: %w", err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).ListBrokers(ctx); err != nil {
		return nil, fmt.Errorf("start kafka: external brokers %s: %w", EnvKafkaBrokers, err)
	}
	return k, nil
}

func (k *Kafka) init(ctx context.Context, opts KafkaOptions) error {
	var err error
	if k.java, err = findJava(); err != nil {
		return err
	}
	if k.libDir, k.version, err = kafkaLibs(ctx); err != nil {
		return err
	}
	if k.baseDir, err = os.MkdirTemp("", "outbox-kafka-"); err != nil {
		return err
	}
	k.dataDir = filepath.Join(k.baseDir, "data")
	k.confPath = filepath.Join(k.baseDir, "server.properties")
	k.log4j = filepath.Join(k.baseDir, "log4j2.properties")
	k.logPath = filepath.Join(k.baseDir, "kafka.log")

	ports, err := FreePorts(4)
	if err != nil {
		return err
	}
	k.port, k.ctrlPort = ports[0], ports[1]
	k.oauth, k.oauthPort = opts.OAuthBearer, ports[3]
	if opts.Security != nil {
		k.security, k.securePort = opts.Security, ports[2]
		k.keystore = filepath.Join(k.baseDir, "sasl-ssl-keystore.pem")
		key, err := pkcs8Key(opts.Security.KeyPEM)
		if err != nil {
			return fmt.Errorf("kafka security: %w", err)
		}
		if err := os.WriteFile(k.keystore, append(key, opts.Security.CertPEM...), 0o600); err != nil {
			return err
		}
	}
	if err := k.writeConfig(opts.Properties); err != nil {
		return err
	}
	if err := k.format(ctx); err != nil {
		return err
	}
	return k.start(ctx)
}

func findJava() (string, error) {
	if home := os.Getenv("JAVA_HOME"); home != "" {
		if p := filepath.Join(home, "bin", "java"); fileExists(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("java")
	if err != nil {
		return "", fmt.Errorf("java not found, install it with: %s", kafkaInstallHint)
	}
	return p, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// kafkaLibs returns the directory of broker jars and the Kafka version. A
// directory given by $OUTBOX_CDC_KAFKA_LIBS that is already complete is used
// as is; otherwise scripts/fetch-kafka.sh runs, which is a no-op taking
// milliseconds when the pinned version is cached, and re-fetches when the
// pom's version changed.
func kafkaLibs(ctx context.Context) (dir, version string, err error) {
	dir = os.Getenv(EnvKafkaLibs)
	if dir != "" {
		if v, ok := readStamp(dir); ok {
			return dir, v, nil
		}
	}
	root, err := RepoRoot()
	if err != nil {
		return "", "", fmt.Errorf("kafka jars: %w (set %s to a directory of Kafka jars)", err, EnvKafkaLibs)
	}
	if dir == "" {
		dir = filepath.Join(root, ".cache", "kafka", "libs")
	}
	script := filepath.Join(root, "scripts", "fetch-kafka.sh")
	if _, ok := readStamp(dir); !ok {
		// Only a real fetch needs Maven; say what to install up front
		// rather than surfacing a shell error.
		if _, err := exec.LookPath("mvn"); err != nil {
			return "", "", fmt.Errorf("kafka jars missing in %s and mvn not found, install it with: %s", dir, kafkaInstallHint)
		}
	}
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Env = append(os.Environ(), EnvKafkaLibs+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("kafka jars: %s: %w\n%s", script, err, out)
	}
	v, ok := readStamp(dir)
	if !ok {
		return "", "", fmt.Errorf("kafka jars: %s left no .complete stamp in %s", script, dir)
	}
	return dir, v, nil
}

// readStamp reads the version written by fetch-kafka.sh after a complete fetch.
func readStamp(dir string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(dir, ".complete"))
	v := strings.TrimSpace(string(b))
	return v, err == nil && v != ""
}

func (k *Kafka) writeConfig(extra map[string]string) error {
	props := map[string]string{
		"node.id":                             "1",
		"process.roles":                       "broker,controller",
		"controller.quorum.bootstrap.servers": k.ctrlAddr(),
		"controller.listener.names":           "CONTROLLER",
		"inter.broker.listener.name":          "PLAINTEXT",
		"listeners":                           fmt.Sprintf("PLAINTEXT://%s,CONTROLLER://%s", k.addr(), k.ctrlAddr()),
		"advertised.listeners":                "PLAINTEXT://" + k.addr(),
		"listener.security.protocol.map":      "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"log.dirs":                            k.dataDir,
		"num.partitions":                      "3",
		"auto.create.topics.enable":           "true",
		"group.initial.rebalance.delay.ms":    "0",
		// A single node cannot satisfy the default replication factor of 3
		// for internal topics.
		"offsets.topic.replication.factor":                 "1",
		"transaction.state.log.replication.factor":         "1",
		"transaction.state.log.min.isr":                    "1",
		"share.coordinator.state.topic.replication.factor": "1",
		"share.coordinator.state.topic.min.isr":            "1",
		// Fewer internal partitions make the first consumer group and the
		// first transaction noticeably faster on a small machine.
		"offsets.topic.num.partitions":         "5",
		"transaction.state.log.num.partitions": "5",
		// After Kill the controller keeps the dead incarnation registered
		// until its session expires (default 9s) and the restarted broker
		// cannot register before that. 6s shortens Kill+Restart while
		// leaving room for slow controller events on a loaded 2-core CI
		// machine (3s led to spurious fencing there).
		"broker.heartbeat.interval.ms": "1000",
		"broker.session.timeout.ms":    "6000",
	}
	if k.security != nil {
		maps.Copy(props, k.securityProperties())
	}
	if k.oauth != nil {
		maps.Copy(props, k.oauthProperties())
		props["listeners"] += ",OAUTH://" + k.oauthAddr()
		props["advertised.listeners"] += ",OAUTH://" + k.oauthAddr()
		props["listener.security.protocol.map"] += ",OAUTH:SASL_PLAINTEXT"
	}
	maps.Copy(props, extra)

	var b strings.Builder
	b.WriteString("# outbox-cdc testenv: single-node KRaft broker+controller\n")
	for _, key := range slices.Sorted(maps.Keys(props)) {
		fmt.Fprintf(&b, "%s=%s\n", key, props[key])
	}
	// 0600: with Security the file holds the PLAIN passwords.
	if err := os.WriteFile(k.confPath, []byte(b.String()), 0o600); err != nil {
		return err
	}

	// Kafka logs through slf4j to log4j2; without a configuration log4j2
	// prints errors only. The config dumps of every internal client are
	// noise, so AbstractConfig is quieted.
	const log4j = `status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = warn
`
	return os.WriteFile(k.log4j, []byte(log4j), 0o644)
}

// format writes the KRaft metadata for a new cluster with this node as the
// only controller voter ("standalone"), which a broker refuses to start without.
func (k *Kafka) format(ctx context.Context) error {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return err
	}
	clusterID := base64.RawURLEncoding.EncodeToString(id)
	// --cluster-id=ID, not two arguments: a random ID may start with '-',
	// which the argument parser would take for an option (1 run in 64).
	args := []string{"format", "--cluster-id=" + clusterID, "--config", k.confPath, "--standalone"}
	scram, err := k.security.scramArgs()
	if err != nil {
		return err
	}
	args = append(args, scram...)
	cmd := exec.CommandContext(ctx, k.java, k.javaArgs("kafka.tools.StorageTool", args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("format kafka storage: %w\n%s", err, tail(string(out), 30))
	}
	return nil
}

func (k *Kafka) javaArgs(mainClass string, args ...string) []string {
	jvm := []string{
		"-Dlog4j2.configurationFile=" + k.log4j,
		"-XX:-UsePerfData",                  // no hsperfdata files left in /tmp
		"-XX:+ExitOnOutOfMemoryError",       // fail loudly instead of limping
		"-cp", filepath.Join(k.libDir, "*"), // java expands the wildcard
	}
	if mainClass == "kafka.Kafka" {
		jvm = append([]string{"-Xms256m", "-Xmx512m"}, jvm...)
	}
	return slices.Concat(jvm, []string{mainClass}, args)
}

func (k *Kafka) start(ctx context.Context) error {
	cmd := exec.Command(k.java, k.javaArgs("kafka.Kafka", k.confPath)...)
	cmd.Dir = k.baseDir
	return startReady(ctx, "kafka", cmd, k.logPath, func(p *process) { k.proc = p }, k.waitReady)
}

// waitReady polls until the broker lists itself in metadata and a topic can
// be created, which needs the controller quorum to be up as well, and with
// Security until a user can authenticate on the SASL_SSL listener.
func (k *Kafka) waitReady(ctx context.Context) error {
	if err := k.waitPlaintextReady(ctx); err != nil {
		return err
	}
	if k.security == nil {
		return nil
	}
	return k.waitSecureReady(ctx)
}

func (k *Kafka) waitPlaintextReady(ctx context.Context) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addr()))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for {
		if k.proc.exited() {
			return fmt.Errorf("kafka exited during startup: %v", k.proc.err)
		}
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := probeKafka(actx, adm)
		cancel()
		if err == nil {
			return nil
		}
		if serr := sleepCtx(ctx, 100*time.Millisecond); serr != nil {
			return fmt.Errorf("kafka not ready: %w (last error: %v)", serr, err)
		}
	}
}

func probeKafka(ctx context.Context, adm *kadm.Client) error {
	brokers, err := adm.ListBrokers(ctx)
	if err != nil {
		return err
	}
	if len(brokers) == 0 {
		return errors.New("no brokers in metadata")
	}
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	topic := "testenv-ready-" + hex.EncodeToString(suffix)
	resp, err := adm.CreateTopic(ctx, 1, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("create probe topic: %w", err)
	}
	// Best effort: a leftover probe topic is harmless.
	_, _ = adm.DeleteTopics(ctx, topic)
	return nil
}

// SecureBrokers returns the bootstrap addresses of the SASL_SSL listener
// (TLS with KafkaSecurity's certificate, SASL SCRAM-SHA-512, SCRAM-SHA-256
// or PLAIN), or nil when the broker was started without Security.
func (k *Kafka) SecureBrokers() []string {
	if k.external != nil || k.security == nil {
		return nil
	}
	return []string{k.secureAddr()}
}

// Brokers returns the bootstrap addresses for clients.
func (k *Kafka) Brokers() []string {
	if k.external != nil {
		return slices.Clone(k.external)
	}
	return []string{k.addr()}
}

func (k *Kafka) addr() string     { return "127.0.0.1:" + strconv.Itoa(k.port) }
func (k *Kafka) ctrlAddr() string { return "127.0.0.1:" + strconv.Itoa(k.ctrlPort) }
func (k *Kafka) secureAddr() string {
	return "127.0.0.1:" + strconv.Itoa(k.securePort)
}

// External reports whether the brokers were given by OUTBOX_CDC_TEST_KAFKA_BROKERS.
func (k *Kafka) External() bool { return k.external != nil }

// LogDir is the broker's data directory (log.dirs); empty when external.
func (k *Kafka) LogDir() string { return k.dataDir }

// LogFile is the broker process's output (log4j) file; empty when external.
func (k *Kafka) LogFile() string { return k.logPath }

// Version is the Apache Kafka version of the broker jars (empty when external).
func (k *Kafka) Version() string { return k.version }

// Running reports whether the managed broker process is up (true for
// external brokers, whose state the harness does not track).
func (k *Kafka) Running() bool {
	if k.external != nil {
		return true
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.proc != nil && !k.proc.exited()
}
