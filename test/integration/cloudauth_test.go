package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// tokenLifetime is short enough that a test outlives the first token: the
// broker ends a session when its token expires (the OAUTH listener sets
// connections.max.reauth.ms), so an event produced after that only arrives
// if the connector got a new token.
const tokenLifetime = 8 * time.Second

// tokenEndpoint is an OAuth 2 token endpoint for the client-credentials
// grant that issues unsecured JWTs. The handler runs on server goroutines:
// it records what went wrong in bad instead of failing the test.
type tokenEndpoint struct {
	srv            *httptest.Server
	issued         atomic.Int64
	down           atomic.Bool  // answer 503 to every request
	refused        atomic.Int64 // requests answered 503
	mu             sync.Mutex
	bad            []string
	tokens         []string
	clientID, pass string
}

func newTokenEndpoint(t *testing.T, clientID, secret string) *tokenEndpoint {
	e := &tokenEndpoint{clientID: clientID, pass: secret}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *tokenEndpoint) serve(w http.ResponseWriter, r *http.Request) {
	if e.down.Load() {
		e.refused.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":"temporarily_unavailable"}`)
		return
	}
	id, secret, ok := r.BasicAuth()
	problem := ""
	switch {
	case r.Method != http.MethodPost || r.URL.Path != "/token":
		problem = r.Method + " " + r.URL.Path
	case r.ParseForm() != nil || r.PostForm.Get("grant_type") != "client_credentials" || r.PostForm.Get("scope") != "kafka":
		problem = "form " + r.PostForm.Encode()
	case !ok || id != e.clientID || secret != e.pass:
		problem = "client authentication"
	}
	if problem != "" {
		e.mu.Lock()
		e.bad = append(e.bad, problem)
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":"invalid_client"}`)
		return
	}
	tok := testenv.UnsecuredJWT("outbox-cdc", tokenLifetime)
	e.mu.Lock()
	e.tokens = append(e.tokens, tok)
	e.mu.Unlock()
	e.issued.Add(1)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"access_token":%q,"token_type":"Bearer","expires_in":%d}`, tok, int(tokenLifetime.Seconds()))
}

func (e *tokenEndpoint) secrets() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string{e.pass}, e.tokens...)
}

func (e *tokenEndpoint) badRequests() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.bad...)
}

// oauthConfig is a connector config that produces through the broker's
// OAUTH listener; sasl holds the indented kafka.sasl.oauth lines.
func oauthConfig(t *testing.T, dsn, slot, addr, sasl string) string {
	t.Helper()
	brokers := kafkaServer.OAuthBrokers()
	if brokers == nil {
		t.Skip("the shared Kafka is external: it has no OAUTHBEARER listener")
	}
	return writeConfig(t, fmt.Sprintf(`
postgres:
  dsn: %s
  slot: %s
  publication: %s
  status_interval: 100ms
  reconnect_backoff_max: 500ms
outbox:
  table: public.outbox
kafka:
  brokers: [%s]
  dlq_topic: %s
  topic: %q
  sasl:
    mechanism: OAUTHBEARER
    oauth:
%shttp:
  listen: %s
log:
  level: debug
`, dsn, slot, slot, strings.Join(brokers, ", "), dlqFor(slot), topicTemplate, sasl, addr))
}

// insertAgg inserts one event of aggregate type aggType for aggregate id.
func insertAgg(t *testing.T, dsn, aggType, id string) {
	t.Helper()
	exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, 'E', '{}')`, aggType, id)
}

// wantKeys fails unless the records of topic are exactly the keys, in order.
func wantKeys(t *testing.T, topic string, keys ...string) {
	t.Helper()
	recs := consumeN(t, []string{topic}, len(keys), time.Minute, 500*time.Millisecond)
	var got []string
	for _, r := range recs {
		got = append(got, string(r.Key))
	}
	// Different keys may land in different partitions, which a consumer
	// reads in no particular order: compare the sets.
	slices.Sort(got)
	keys = slices.Sorted(slices.Values(keys))
	if strings.Join(got, ",") != strings.Join(keys, ",") {
		t.Errorf("records of %s: keys %v, want %v", topic, got, keys)
	}
}

// noneOf fails if out holds any of the secrets.
func noneOf(t *testing.T, what, out string, secrets []string) {
	t.Helper()
	for i, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("%s shows secret #%d", what, i)
		}
	}
}

// TestOAuthBearerClientCredentials runs the binary against the OAUTHBEARER
// listener with tokens from a client-credentials endpoint: an event arrives
// with the first token; after that token expired (and with it the broker
// session) another event arrives, which needs a second token.
func TestOAuthBearerClientCredentials(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, "oauth_cc")
	secret := "cs-" + runID + "-not-in-any-log"
	ep := newTokenEndpoint(t, "outbox-cdc-client", secret)
	secretFile := filepath.Join(t.TempDir(), "client-secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := oauthConfig(t, dsn, "oauth_cc", addr, fmt.Sprintf(`      token_url: %s/token
      client_id: outbox-cdc-client
      client_secret_file: %s
      scope: kafka
`, ep.srv.URL, secretFile))
	aggType := "oauthcc"

	code, out := runBinary(t, time.Minute, nil, "check", "--config", cfg)
	if code != 0 || !strings.Contains(out, "kafka: ok") {
		t.Fatalf("check: exit %d, want 0 with kafka: ok:\n%s", code, out)
	}
	noneOf(t, "check output", out, ep.secrets())

	p := startProcess(t, cfg, addr)
	first := time.Now()
	insertAgg(t, dsn, aggType, "before-expiry")
	wantKeys(t, topicFor(aggType), "before-expiry")
	if n := ep.issued.Load(); n < 1 {
		t.Fatalf("an event arrived but the token endpoint issued %d tokens", n)
	}

	// Past the first token's expiry: its session is over.
	time.Sleep(time.Until(first.Add(tokenLifetime + 2*time.Second)))
	insertAgg(t, dsn, aggType, "after-expiry")
	wantKeys(t, topicFor(aggType), "before-expiry", "after-expiry")
	if n := ep.issued.Load(); n < 2 {
		t.Errorf("token endpoint issued %d tokens, want a second one after the first expired", n)
	}
	if bad := ep.badRequests(); len(bad) > 0 {
		t.Errorf("token endpoint got bad requests: %v", bad)
	}
	stopClean(t, p)
	noneOf(t, "connector log", p.output(), ep.secrets())
}

// TestOAuthBearerTokenFile: the token comes from a file that is replaced
// (write and rename, as the kubelet does) while the connector runs; the
// event after the first token expired arrives with the second.
func TestOAuthBearerTokenFile(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, "oauth_file")
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	replace := func(tok string) {
		tmp := filepath.Join(dir, "token.tmp")
		if err := os.WriteFile(tmp, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, tokenFile); err != nil {
			t.Fatal(err)
		}
	}
	tokens := []string{testenv.UnsecuredJWT("outbox-cdc", tokenLifetime)}
	first := time.Now()
	replace(tokens[0])
	cfg := oauthConfig(t, dsn, "oauth_file", addr, fmt.Sprintf("      token_file: %s\n", tokenFile))
	aggType := "oauthfile"

	p := startProcess(t, cfg, addr)
	insertAgg(t, dsn, aggType, "first-token")
	wantKeys(t, topicFor(aggType), "first-token")

	tokens = append(tokens, testenv.UnsecuredJWT("outbox-cdc", 5*time.Minute))
	replace(tokens[1])
	time.Sleep(time.Until(first.Add(tokenLifetime + 2*time.Second)))
	insertAgg(t, dsn, aggType, "second-token")
	wantKeys(t, topicFor(aggType), "first-token", "second-token")
	stopClean(t, p)
	noneOf(t, "connector log", p.output(), tokens)
}

// TestPostgresPasswordCommandRestart: the connector's role needs a password
// (scram-sha-256 over TLS) that postgres.password_command prints. The test
// changes it with ALTER ROLE and restarts PostgreSQL; the connector
// reconnects with the new one, so events before and after arrive.
func TestPostgresPasswordCommandRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ca, err := testenv.NewTestCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.ServerCert("localhost", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	const role = "cdc_cmd"
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{TLS: &testenv.PostgresTLS{
		CertPEM: cert, KeyPEM: key, PasswordRoles: []string{role}}})
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	t.Cleanup(func() { pg.Close() })

	dir := t.TempDir()
	caFile := writeSecret(t, dir, "ca.pem", string(ca.CertPEM))
	passwords := []string{"pw1-" + runID + "-secret", "pw2-" + runID + "-secret"}
	pwFile := writeSecret(t, dir, "current", passwords[0])
	calls := filepath.Join(dir, "calls")
	exec1(t, pg.DSN("postgres"), fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'", role, passwords[0]))
	adminDSN, err := pg.CreateDatabase(ctx, "pwcmd")
	if err != nil {
		t.Fatal(err)
	}
	createOutbox(t, adminDSN, "outbox", "jsonb")
	exec1(t, adminDSN, "ALTER TABLE outbox OWNER TO "+role)
	exec1(t, adminDSN, "GRANT CREATE ON DATABASE pwcmd TO "+role) // the publication

	addr := freeAddr(t)
	// The command counts its runs and prints the current password.
	command := fmt.Sprintf("echo run >> %s && cat %s", calls, pwFile)
	cfg := writeConfig(t, fmt.Sprintf(`
postgres:
  dsn: %q
  password_command: %q
  password_command_timeout: 5s
  slot: pwcmd
  publication: pwcmd
  status_interval: 100ms
  reconnect_backoff_max: 500ms
  heartbeat_interval: 0s
outbox:
  table: public.outbox
kafka:
  brokers: [%s]
  dlq_topic: %s
  topic: %q
checkpoint:
  store: none
http:
  listen: %s
`, pg.TLSDSN("pwcmd", role, caFile), command, strings.Join(kafkaServer.Brokers(), ", "), dlqFor("pwcmd"), topicTemplate, addr))
	runs := func() int {
		b, _ := os.ReadFile(calls)
		return strings.Count(string(b), "run")
	}
	aggType := "pwcmd"

	p := startProcess(t, cfg, addr)
	insertAgg(t, adminDSN, aggType, "before-restart")
	wantKeys(t, topicFor(aggType), "before-restart")
	before := runs()
	if before < 1 {
		t.Fatalf("an event arrived but the password command ran %d times", before)
	}

	// New password on the server and in what the command prints, then a
	// restart: every connection the connector opens from now on must use
	// the new one.
	exec1(t, pg.DSN("postgres"), fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", role, passwords[1]))
	if err := os.WriteFile(pwFile, []byte(passwords[1]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatalf("restart postgres: %v", err)
	}
	insertAgg(t, adminDSN, aggType, "after-restart")
	wantKeys(t, topicFor(aggType), "before-restart", "after-restart")
	if after := runs(); after <= before {
		t.Errorf("password command ran %d times before the restart and %d after, want more runs after", before, after)
	}
	select {
	case <-p.done:
		t.Fatalf("connector exited: %v\n%s", p.err, p.output())
	default:
	}
	stopClean(t, p)
	noneOf(t, "connector log", p.output(), passwords)
}

// TestOAuthBearerTokenEndpointDown: while the token endpoint answers 503
// the connector keeps running, says why (naming the endpoint) and retries;
// once the endpoint is back the event arrives.
func TestOAuthBearerTokenEndpointDown(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, "oauth_down")
	secret := "cs-down-" + runID
	ep := newTokenEndpoint(t, "outbox-cdc-client", secret)
	ep.down.Store(true)
	cfg := oauthConfig(t, dsn, "oauth_down", addr, fmt.Sprintf(`      token_url: %s/token
      client_id: outbox-cdc-client
      client_secret: %s
      scope: kafka
`, ep.srv.URL, secret))
	aggType := "oauthdown"

	// Not /readyz, which may wait for Kafka: the slot must exist before the
	// insert, or the event is not in the stream.
	p := startProc(t, cfg, addr, false)
	waitFor(t, time.Minute, "replication to start", func() bool { return strings.Contains(p.output(), "replication started") })
	insertAgg(t, dsn, aggType, "while-down")
	want := "no OAUTHBEARER token"
	for deadline := time.Now().Add(time.Minute); ; {
		out := p.output()
		if i := strings.Index(out, want); ep.refused.Load() >= 2 && i >= 0 && strings.Contains(out, ep.srv.URL+"/token") {
			line, _, _ := strings.Cut(out[strings.LastIndexByte(out[:i], '\n')+1:], "\n")
			t.Logf("while the endpoint is down: %s", line)
			break
		}
		select {
		case <-p.done:
			t.Fatalf("connector exited while the token endpoint was down: %v\n%s", p.err, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 1m the endpoint refused %d requests; the log lacks %q with the endpoint's URL:\n%s", ep.refused.Load(), want, out)
		}
		time.Sleep(100 * time.Millisecond) // poll interval: the log and the counter are read again
	}
	ep.down.Store(false)
	wantKeys(t, topicFor(aggType), "while-down")
	if ep.issued.Load() < 1 {
		t.Errorf("the event arrived without a token from the endpoint")
	}
	stopClean(t, p)
	noneOf(t, "connector log", p.output(), ep.secrets())
}
