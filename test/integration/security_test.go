package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// secureEnv is a PostgreSQL that requires TLS and a password for the
// connector's role, and a Kafka broker with a SASL_SSL listener, both
// private to TestSecurity, plus the files the connector is given.
type secureEnv struct {
	pg *testenv.Postgres
	k  *testenv.Kafka
	ca *testenv.TestCA

	adminDSN string // superuser, no TLS: test setup only
	dsn      string // the connector's role over verify-full, without password
	caFile   string // the CA of both servers' certificates
	otherCA  string // a CA that signed neither

	pgPassword, saslPassword string
	// secrets are every password the test uses, right or wrong: none may
	// appear in any output of the connector.
	secrets []string
}

const (
	secRole     = "cdc_tls"
	secDB       = "secure_outbox"
	secSASLUser = "outbox-cdc"
)

func secretString(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b)
}

// startSecureEnv starts both servers at once (the JVM dominates) and
// prepares the database: the connector's role owns the outbox table and may
// create the checkpoint schema; it can only connect with TLS and a password.
func startSecureEnv(t *testing.T) *secureEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := &secureEnv{
		pgPassword:   secretString(t, "pgpw"),
		saslPassword: secretString(t, "saslpw"),
	}
	var err error
	if e.ca, err = testenv.NewTestCA(); err != nil {
		t.Fatal(err)
	}
	cert, key, err := e.ca.ServerCert("localhost", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testenv.NewTestCA()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e.caFile = writeSecret(t, dir, "ca.pem", string(e.ca.CertPEM))
	e.otherCA = writeSecret(t, dir, "other-ca.pem", string(other.CertPEM))

	var wg sync.WaitGroup
	var pgErr, kErr error
	wg.Go(func() {
		e.pg, pgErr = testenv.StartPostgres(ctx, testenv.PostgresOptions{TLS: &testenv.PostgresTLS{
			CertPEM: cert, KeyPEM: key, PasswordRoles: []string{secRole},
		}})
	})
	wg.Go(func() {
		e.k, kErr = testenv.StartKafka(ctx, testenv.KafkaOptions{Security: &testenv.KafkaSecurity{
			CertPEM: cert, KeyPEM: key, SCRAMUsers: map[string]string{secSASLUser: e.saslPassword},
		}})
	})
	wg.Wait()
	if e.pg != nil {
		t.Cleanup(func() { e.pg.Close() })
	}
	if e.k != nil {
		t.Cleanup(func() { e.k.Close() })
	}
	if pgErr != nil || kErr != nil {
		t.Fatalf("start secure servers: postgres: %v; kafka: %v", pgErr, kErr)
	}

	exec1(t, e.pg.DSN("postgres"), fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'", secRole, e.pgPassword))
	if e.adminDSN, err = e.pg.CreateDatabase(ctx, secDB); err != nil {
		t.Fatal(err)
	}
	createOutbox(t, e.adminDSN, "outbox", "jsonb")
	exec1(t, e.adminDSN, "ALTER TABLE outbox OWNER TO "+secRole)
	exec1(t, e.adminDSN, "GRANT CREATE ON DATABASE "+secDB+" TO "+secRole)
	e.dsn = e.pg.TLSDSN(secDB, secRole, e.caFile)
	e.secrets = []string{e.pgPassword, e.saslPassword}
	return e
}

// withPassword puts pw into the DSN's user info (the passwords are hex, no
// escaping needed).
func withPassword(dsn, pw string) string {
	return strings.Replace(dsn, secRole+"@", secRole+":"+pw+"@", 1)
}

// wrongSecret returns a new distinctive wrong password and remembers it, so
// it too is checked for in every output.
func (e *secureEnv) wrongSecret(t *testing.T, prefix string) string {
	s := secretString(t, prefix)
	e.secrets = append(e.secrets, s)
	return s
}

// noSecrets fails the test if out holds any password; the message shows
// the output with the passwords masked.
func (e *secureEnv) noSecrets(t *testing.T, what, out string) {
	t.Helper()
	var leaked []string
	masked := out
	for i, s := range e.secrets {
		if strings.Contains(out, s) {
			leaked = append(leaked, fmt.Sprintf("secret #%d", i))
			masked = strings.ReplaceAll(masked, s, fmt.Sprintf("<SECRET #%d>", i))
		}
	}
	if len(leaked) > 0 {
		t.Errorf("%s: output shows %s:\n%s", what, strings.Join(leaked, ", "), masked)
	}
}

// logTail logs the last lines of out, passwords masked, so -v shows what
// each failure looks like to an operator.
func (e *secureEnv) logTail(t *testing.T, what, out string) {
	t.Helper()
	for i, s := range e.secrets {
		out = strings.ReplaceAll(out, s, fmt.Sprintf("<SECRET #%d>", i))
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) > 6 {
		lines = lines[len(lines)-6:]
	}
	t.Logf("%s:\n\t%s", what, strings.Join(lines, "\n\t"))
}

func writeSecret(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// secureYAML is a connector config for the secure servers (TLS with the
// CA, SCRAM-SHA-512). dsnLine and pgExtra are indented lines for the
// postgres section ("" to leave the DSN to the environment), kafkaTLSExtra
// and saslExtra lines for kafka.tls and kafka.sasl.
func (e *secureEnv) secureYAML(slot, addr, dsnLine, pgExtra, kafkaTLSExtra, saslExtra string) string {
	return fmt.Sprintf(`postgres:
%s  slot: %s
  publication: %s
  status_interval: 100ms
  reconnect_backoff_max: 500ms
%soutbox:
  table: public.outbox
kafka:
  brokers: [%s]
  dlq_topic: dlq.%s
  tls:
    enabled: true
    ca_file: %q
%s  sasl:
    mechanism: SCRAM-SHA-512
    username: %s
%shttp:
  listen: %q
log:
  level: debug
`, dsnLine, slot, slot, pgExtra, strings.Join(e.k.SecureBrokers(), ", "), slot, e.caFile, kafkaTLSExtra, secSASLUser, saslExtra, addr)
}

// consumeSecure reads want records of topic over SASL_SSL (SCRAM-SHA-512,
// the broker's certificate verified against the CA).
func (e *secureEnv) consumeSecure(t *testing.T, topic string, want int) []*kgo.Record {
	t.Helper()
	opts, err := e.k.SecureClientOpts(e.ca.Pool(), secSASLUser)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records from %s over SASL_SSL", len(recs), want, topic)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Logf("fetch %s/%d: %v", tp, p, err) })
		recs = append(recs, fs.Records()...)
	}
	return recs
}

func (e *secureEnv) insertEvent(t *testing.T, aggType, aggID string) {
	t.Helper()
	exec1(t, e.adminDSN, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, 'Secured', '{"ok": true}')`,
		aggType, aggID)
}

// checkEnviron fails if the running process's initial environment
// (/proc/<pid>/environ) holds a password given through a file.
func (e *secureEnv) checkEnviron(t *testing.T, p *process) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/environ")
	if err != nil {
		t.Logf("cannot read the connector's environ: %v", err)
		return
	}
	e.noSecrets(t, "/proc/<pid>/environ", string(b))
}

// positive runs check, run (an event inserted arrives over SASL_SSL), a
// clean stop and status with one way of passing the passwords, and checks
// every output for the passwords.
func (e *secureEnv) positive(t *testing.T, cfgPath, addr, aggType string, env []string, fromFile bool) {
	t.Helper()
	code, out := runBinary(t, time.Minute, env, "check", "--config", cfgPath)
	e.noSecrets(t, "check", out)
	if code != 0 || !strings.Contains(out, "postgres: ok") || !strings.Contains(out, "kafka: ok") {
		t.Fatalf("check: exit %d, want 0 with postgres: ok and kafka: ok:\n%s", code, out)
	}

	p := startProc(t, cfgPath, addr, true, env...)
	if fromFile {
		e.checkEnviron(t, p)
	}
	e.insertEvent(t, aggType, "agg-"+aggType)
	recs := e.consumeSecure(t, "outbox.event."+aggType, 1)
	if string(recs[0].Key) != "agg-"+aggType || string(recs[0].Value) != `{"ok": true}` {
		t.Errorf("record key %q value %q", recs[0].Key, recs[0].Value)
	}
	stopClean(t, p)
	e.noSecrets(t, "run", p.output())

	for _, args := range [][]string{{"status", "--config", cfgPath}, {"status", "--config", cfgPath, "--json"}} {
		code, out = runBinary(t, time.Minute, env, args...)
		e.noSecrets(t, strings.Join(args, " "), out)
		if code != 0 {
			t.Errorf("%v: exit %d, want 0:\n%s", args, code, out)
		}
	}
}

// TestSecurity runs the real binary against PostgreSQL with
// sslmode=verify-full and a password, and Kafka over SASL_SSL with
// SCRAM-SHA-512, the passwords given in the config file, the environment
// and password files; then with wrong passwords and untrusted certificates.
// No password may appear in any output of any run.
func TestSecurity(t *testing.T) {
	if os.Getenv(testenv.EnvPGDSN) != "" || os.Getenv(testenv.EnvKafkaBrokers) != "" {
		t.Skip("needs its own TLS PostgreSQL and SASL_SSL Kafka; " + testenv.EnvPGDSN + " or " + testenv.EnvKafkaBrokers + " is set")
	}
	e := startSecureEnv(t)
	dir := t.TempDir()
	pgPassFile := writeSecret(t, dir, "pg-password", e.pgPassword+"\n")
	saslPassFile := writeSecret(t, dir, "sasl-password", e.saslPassword+"\n")

	// The role really needs TLS: the same password without it is refused.
	func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		plain := strings.Replace(e.pg.DSN(secDB), "postgres@", secRole+":"+e.pgPassword+"@", 1)
		if c, err := pgx.Connect(ctx, plain); err == nil {
			c.Close(ctx)
			t.Fatal("the connector's role connected without TLS")
		}
	}()

	t.Run("passwords in the config file", func(t *testing.T) {
		addr := freeAddr(t)
		cfg := writeConfig(t, e.secureYAML("sec_file_cfg", addr,
			fmt.Sprintf("  dsn: %q\n", withPassword(e.dsn, e.pgPassword)), "", "",
			fmt.Sprintf("    password: %q\n", e.saslPassword)))
		e.positive(t, cfg, addr, "inyaml", nil, false)
	})

	t.Run("passwords from the environment", func(t *testing.T) {
		addr := freeAddr(t)
		cfg := writeConfig(t, e.secureYAML("sec_env", addr, "", "", "", ""))
		env := []string{
			"OUTBOX_CDC_POSTGRES_DSN=" + withPassword(e.dsn, e.pgPassword),
			"OUTBOX_CDC_KAFKA_SASL_PASSWORD=" + e.saslPassword,
			"OUTBOX_CDC_LOG_FORMAT=json",
		}
		e.positive(t, cfg, addr, "inenv", env, false)
	})

	t.Run("password files", func(t *testing.T) {
		addr := freeAddr(t)
		// server_name: localhost is checked instead of the advertised
		// 127.0.0.1; the certificate has both.
		cfg := writeConfig(t, e.secureYAML("sec_files", addr,
			fmt.Sprintf("  dsn: %q\n", e.dsn), fmt.Sprintf("  password_file: %q\n", pgPassFile),
			"    server_name: localhost\n", fmt.Sprintf("    password_file: %q\n", saslPassFile)))
		e.positive(t, cfg, addr, "infiles", nil, true)
	})

	t.Run("password files named in the environment", func(t *testing.T) {
		addr := freeAddr(t)
		cfg := writeConfig(t, e.secureYAML("sec_env_files", addr, fmt.Sprintf("  dsn: %q\n", e.dsn), "", "", ""))
		env := []string{
			"OUTBOX_CDC_POSTGRES_PASSWORD_FILE=" + pgPassFile,
			"OUTBOX_CDC_KAFKA_SASL_PASSWORD_FILE=" + saslPassFile,
		}
		e.positive(t, cfg, addr, "inenvfiles", env, true)
	})

	t.Run("wrong SASL password", func(t *testing.T) {
		wrong := e.wrongSecret(t, "wrongsasl")
		wrongFile := writeSecret(t, t.TempDir(), "wrong-sasl", wrong+"\n")
		addr := freeAddr(t)
		cfg := writeConfig(t, e.secureYAML("sec_wrong_sasl", addr,
			fmt.Sprintf("  dsn: %q\n", e.dsn), fmt.Sprintf("  password_file: %q\n", pgPassFile), "",
			fmt.Sprintf("    password_file: %q\n", wrongFile)))
		envCfg := writeConfig(t, e.secureYAML("sec_wrong_sasl", addr, fmt.Sprintf("  dsn: %q\n", e.dsn),
			fmt.Sprintf("  password_file: %q\n", pgPassFile), "", ""))
		env := []string{"OUTBOX_CDC_KAFKA_SASL_PASSWORD=" + wrong}
		for _, c := range []struct {
			how string
			cfg string
			env []string
		}{{"file", cfg, nil}, {"env", envCfg, env}} {
			code, out := runBinary(t, time.Minute, c.env, "check", "--config", c.cfg)
			e.noSecrets(t, "check ("+c.how+")", out)
			e.logTail(t, "check, wrong SASL password ("+c.how+")", out)
			if code != 1 || !strings.Contains(out, "postgres: ok") || !strings.Contains(out, "kafka: ") ||
				!strings.Contains(strings.ToLower(out), "authentication") {
				t.Errorf("check (%s): exit %d, want 1 with a Kafka authentication error:\n%s", c.how, code, out)
			}
		}
		// run: the producer cannot authenticate. The client retries (the
		// credentials may be fixed on the broker while the connector
		// waits) and the log says why nothing gets out; the password
		// appears nowhere.
		p := startProc(t, envCfg, addr, true, env...)
		e.insertEvent(t, "wrongsasl", "a") // after the slot exists
		waitFor(t, time.Minute, "the SASL failure in the log", func() bool {
			select {
			case <-p.done:
				return true
			default:
			}
			return strings.Contains(p.output(), "SASL authentication failed")
		})
		select {
		case <-p.done:
			if p.err == nil {
				t.Errorf("run exited 0 with a wrong SASL password")
			}
		default:
			p.kill()
		}
		out := p.output()
		e.noSecrets(t, "run", out)
		e.logTail(t, "run, wrong SASL password", out)
		if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "kafka.sasl.username and the password") {
			t.Errorf("run: the log does not say the SASL authentication failed:\n%s", out)
		}
	})

	t.Run("wrong PostgreSQL password", func(t *testing.T) {
		wrong := e.wrongSecret(t, "wrongpg")
		wrongFile := writeSecret(t, t.TempDir(), "wrong-pg", wrong+"\n")
		addr := freeAddr(t)
		sasl := fmt.Sprintf("    password_file: %q\n", saslPassFile)
		inDSN := writeConfig(t, e.secureYAML("sec_wrong_pg", addr, fmt.Sprintf("  dsn: %q\n", withPassword(e.dsn, wrong)), "", "", sasl))
		inFile := writeConfig(t, e.secureYAML("sec_wrong_pg", addr, fmt.Sprintf("  dsn: %q\n", e.dsn),
			fmt.Sprintf("  password_file: %q\n", wrongFile), "", sasl))
		envOnly := writeConfig(t, e.secureYAML("sec_wrong_pg", addr, "", "", "", sasl))
		for _, c := range []struct {
			how string
			cfg string
			env []string
		}{
			{"dsn in the file", inDSN, nil},
			{"password file", inFile, nil},
			{"dsn in the environment", envOnly, []string{"OUTBOX_CDC_POSTGRES_DSN=" + withPassword(e.dsn, wrong)}},
		} {
			for _, cmd := range []string{"run", "check", "status"} {
				code, out := runBinary(t, time.Minute, c.env, cmd, "--config", c.cfg)
				e.noSecrets(t, cmd+" ("+c.how+")", out)
				e.logTail(t, cmd+", wrong PostgreSQL password ("+c.how+")", out)
				if code != 1 || !strings.Contains(out, "password authentication failed") {
					t.Errorf("%s (%s): exit %d, want 1 with the authentication error:\n%s", cmd, c.how, code, out)
				}
			}
		}
	})

	t.Run("untrusted certificates", func(t *testing.T) {
		addr := freeAddr(t)
		// PostgreSQL's certificate checked against another CA.
		otherDSN := strings.Replace(withPassword(e.dsn, e.pgPassword), filepath.Base(e.caFile), filepath.Base(e.otherCA), 1)
		cfg := writeConfig(t, e.secureYAML("sec_untrusted", addr, fmt.Sprintf("  dsn: %q\n", otherDSN), "", "",
			fmt.Sprintf("    password_file: %q\n", saslPassFile)))
		code, out := runBinary(t, time.Minute, nil, "check", "--config", cfg)
		e.noSecrets(t, "check (postgres CA)", out)
		e.logTail(t, "check, PostgreSQL certificate untrusted", out)
		if code != 1 || !strings.Contains(out, "postgres: ") || !strings.Contains(out, "certificate") || !strings.Contains(out, "kafka: ok") {
			t.Errorf("check with PostgreSQL's certificate untrusted: exit %d:\n%s", code, out)
		}
		// Kafka's certificate checked against another CA.
		y := e.secureYAML("sec_untrusted", addr, fmt.Sprintf("  dsn: %q\n", e.dsn), fmt.Sprintf("  password_file: %q\n", pgPassFile), "",
			fmt.Sprintf("    password_file: %q\n", saslPassFile))
		y = strings.Replace(y, strconv.Quote(e.caFile), strconv.Quote(e.otherCA), 1)
		code, out = runBinary(t, time.Minute, nil, "check", "--config", writeConfig(t, y))
		e.noSecrets(t, "check (kafka CA)", out)
		e.logTail(t, "check, Kafka certificate untrusted", out)
		if code != 1 || !strings.Contains(out, "postgres: ok") || !strings.Contains(out, "kafka: ") || !strings.Contains(out, "certificate") {
			t.Errorf("check with Kafka's certificate untrusted: exit %d:\n%s", code, out)
		}
	})

	t.Run("warnings", func(t *testing.T) {
		addr := freeAddr(t)
		base := e.secureYAML("sec_warn", addr, fmt.Sprintf("  dsn: %q\n", e.dsn), fmt.Sprintf("  password_file: %q\n", pgPassFile), "",
			fmt.Sprintf("    password_file: %q\n", saslPassFile))
		caLine := fmt.Sprintf("    ca_file: %q\n", e.caFile)
		// insecure_skip_verify works, with a warning.
		y := strings.Replace(base, caLine, "    insecure_skip_verify: true\n", 1)
		code, out := runBinary(t, time.Minute, nil, "check", "--config", writeConfig(t, y))
		e.noSecrets(t, "check (insecure_skip_verify)", out)
		e.logTail(t, "check, insecure_skip_verify", out)
		if code != 0 || !strings.Contains(out, "level=WARN") || !strings.Contains(out, "key=kafka.tls.insecure_skip_verify") {
			t.Errorf("insecure_skip_verify: exit %d, want 0 with a warning:\n%s", code, out)
		}
		// PLAIN without TLS: a warning; against the SASL_SSL port it cannot
		// work, and the log says the broker closed the connection.
		y = strings.Replace(strings.Replace(base, caLine, "", 1), "    enabled: true\n", "    enabled: false\n", 1)
		y = strings.Replace(y, "mechanism: SCRAM-SHA-512", "mechanism: PLAIN", 1)
		code, out = runBinary(t, time.Minute, nil, "check", "--config", writeConfig(t, y))
		e.noSecrets(t, "check (PLAIN without TLS)", out)
		e.logTail(t, "check, PLAIN without TLS", out)
		if code != 1 || !strings.Contains(out, "key=kafka.sasl.mechanism") || !strings.Contains(out, "clear text") ||
			!strings.Contains(out, "check kafka.tls.enabled") {
			t.Errorf("PLAIN without TLS: exit %d, want 1 with a warning:\n%s", code, out)
		}
	})

	t.Run("bad security configuration", func(t *testing.T) {
		addr := freeAddr(t)
		// A password next to a password file, and a missing CA: exit 2,
		// naming the keys, without the password.
		y := e.secureYAML("sec_bad", addr, fmt.Sprintf("  dsn: %q\n", withPassword(e.dsn, e.pgPassword)),
			fmt.Sprintf("  password_file: %q\n", pgPassFile), "",
			fmt.Sprintf("    password: %q\n    password_file: %q\n", e.saslPassword, saslPassFile))
		y = strings.Replace(y, strconv.Quote(e.caFile), strconv.Quote(e.caFile+".missing"), 1)
		code, out := runBinary(t, time.Minute, nil, "check", "--config", writeConfig(t, y))
		e.noSecrets(t, "check (bad config)", out)
		e.logTail(t, "check, bad security configuration", out)
		for _, want := range []string{"postgres.password_file", "kafka.sasl.password", "kafka.tls.ca_file"} {
			if !strings.Contains(out, want) {
				t.Errorf("bad config: output does not name %s", want)
			}
		}
		if code != 2 {
			t.Errorf("bad config: exit %d, want 2:\n%s", code, out)
		}
	})
}
