package kafkaopt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAWSMSKIAMSigning: the credentials of the environment reach franz-go's
// SigV4 payload. The signing time is franz-go's clock, so the test checks
// the fields and that the date is today's, not a fixed signature.
func TestAWSMSKIAMSigning(t *testing.T) {
	env := map[string]string{
		EnvAWSAccessKeyID:     "AKIDEXAMPLE",
		EnvAWSSecretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
		EnvAWSSessionToken:    "session-token/+=",
	}
	m := awsMechanism(func(k string) string { return env[k] })
	if m.Name() != MechanismAWSMSKIAM {
		t.Errorf("name %q", m.Name())
	}
	const host = "b-1.demo.abc123.c2.kafka.eu-west-1.amazonaws.com"
	_, payload, err := m.Authenticate(context.Background(), host+":9098")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(payload, &got); err != nil {
		t.Fatalf("payload %s: %v", payload, err)
	}
	date := time.Now().UTC().Format("20060102")
	for k, want := range map[string]string{
		"version":              "2020_10_22",
		"host":                 host,
		"user-agent":           "outbox-cdc",
		"action":               "kafka-cluster:Connect",
		"x-amz-algorithm":      "AWS4-HMAC-SHA256",
		"x-amz-credential":     "AKIDEXAMPLE/" + date + "/eu-west-1/kafka-cluster/aws4_request",
		"x-amz-security-token": "session-token/+=",
		"x-amz-signedheaders":  "host",
		"x-amz-expires":        "900",
	} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	if sig := got["x-amz-signature"]; len(sig) != 64 || strings.Trim(sig, "0123456789abcdef") != "" {
		t.Errorf("x-amz-signature %q, want 64 hex digits", sig)
	}
	if strings.Contains(string(payload), env[EnvAWSSecretAccessKey]) {
		t.Error("the payload holds the secret access key")
	}

	// Without a session token (long-term keys) none is sent.
	delete(env, EnvAWSSessionToken)
	_, payload, err = m.Authenticate(context.Background(), host+":9098")
	if err != nil || strings.Contains(string(payload), "x-amz-security-token") {
		t.Errorf("without a session token: %s, %v", payload, err)
	}
}

func TestAWSCredentialsProblem(t *testing.T) {
	for _, tt := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{EnvAWSAccessKeyID: "a", EnvAWSSecretAccessKey: "b"}, false},
		{map[string]string{EnvAWSAccessKeyID: "a"}, true},
		{map[string]string{EnvAWSSecretAccessKey: "b"}, true},
		{nil, true},
	} {
		p := AWSCredentialsProblem(func(k string) string { return tt.env[k] })
		if (p != "") != tt.want {
			t.Errorf("env %v: problem %q", tt.env, p)
		}
	}
	m := awsMechanism(func(string) string { return "" })
	if _, _, err := m.Authenticate(context.Background(), "b-1.x.kafka.us-east-1.amazonaws.com:9098"); err == nil ||
		!strings.Contains(err.Error(), EnvAWSAccessKeyID) {
		t.Errorf("no credentials: %v", err)
	}
}

// fakeSTS answers AssumeRoleWithWebIdentity with credentials named after
// the request count, valid for an hour from expiresFrom; fail makes it
// refuse. Handler goroutines only record.
type fakeSTS struct {
	mu          sync.Mutex
	forms       []url.Values
	expiresFrom time.Time
	fail        bool
}

func (f *fakeSTS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	f.mu.Lock()
	f.forms = append(f.forms, r.PostForm)
	n, fail := len(f.forms), f.fail
	f.mu.Unlock()
	if fail {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>Not authorized to perform sts:AssumeRoleWithWebIdentity</Message></Error></ErrorResponse>`)
		return
	}
	fmt.Fprintf(w, `<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <Credentials>
      <AccessKeyId>ASIA%d</AccessKeyId>
      <SecretAccessKey>secret-%d</SecretAccessKey>
      <SessionToken>session-%d</SessionToken>
      <Expiration>%s</Expiration>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
</AssumeRoleWithWebIdentityResponse>`, n, n, n, f.expiresFrom.Add(time.Hour).UTC().Format(time.RFC3339))
}

func TestAWSWebIdentity(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	sts := &fakeSTS{expiresFrom: now}
	srv := httptest.NewServer(sts)
	defer srv.Close()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("eyJ.projected.token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		EnvAWSWebIdentityTokenFile: tokenFile,
		EnvAWSRoleARN:              "arn:aws:iam::123456789012:role/outbox-cdc",
		EnvAWSEndpointURLSTS:       srv.URL,
	}
	c := &awsCredentials{getenv: func(k string) string { return env[k] }, client: srv.Client(), now: func() time.Time { return now }}
	if AWSCredentialsProblem(c.getenv) != "" {
		t.Fatalf("web identity not accepted: %s", AWSCredentialsProblem(c.getenv))
	}

	// An hour of validity: kept until 5 minutes before the end.
	start := now
	for _, st := range []struct {
		at       time.Duration
		wantKey  string
		requests int
	}{
		{0, "ASIA1", 1},
		{30 * time.Minute, "ASIA1", 1},
		{55 * time.Minute, "ASIA2", 2},
	} {
		now = start.Add(st.at)
		a, err := c.auth(t.Context())
		if err != nil || a.AccessKey != st.wantKey || len(sts.forms) != st.requests {
			t.Errorf("at +%s: key %q, %v after %d requests; want %q after %d", st.at, a.AccessKey, err, len(sts.forms), st.wantKey, st.requests)
		}
		if err == nil && (a.SecretKey != "secret-"+st.wantKey[4:] || a.SessionToken != "session-"+st.wantKey[4:]) {
			t.Errorf("at +%s: credentials %+v", st.at, a)
		}
	}
	f := sts.forms[0]
	if f.Get("Action") != "AssumeRoleWithWebIdentity" || f.Get("Version") != "2011-06-15" ||
		f.Get("RoleArn") != env[EnvAWSRoleARN] || f.Get("WebIdentityToken") != "eyJ.projected.token" ||
		!strings.HasPrefix(f.Get("RoleSessionName"), "outbox-cdc-") {
		t.Errorf("STS request %v", f)
	}

	// Refused: a temporary error naming STS and the reason, not the token.
	sts.fail = true
	now = start.Add(2 * time.Hour)
	_, err := c.auth(t.Context())
	var te *TokenError
	if !errors.As(err, &te) || !te.Temporary() || !strings.Contains(err.Error(), "AWS credentials from STS AssumeRoleWithWebIdentity "+srv.URL) ||
		!strings.Contains(err.Error(), "AccessDenied (Not authorized") || strings.Contains(err.Error(), "projected.token") {
		t.Errorf("refused: %v", err)
	}
	if r := SecurityFailure(err); !strings.Contains(r, "no AWS credentials") || !strings.Contains(r, EnvAWSRoleARN) {
		t.Errorf("SecurityFailure = %q", r)
	}

	// Access keys in the environment win: no STS request.
	env[EnvAWSAccessKeyID], env[EnvAWSSecretAccessKey] = "AKID", "SK"
	before := len(sts.forms)
	if a, err := c.auth(t.Context()); err != nil || a.AccessKey != "AKID" || len(sts.forms) != before {
		t.Errorf("static keys: %+v, %v, %d STS requests", a, err, len(sts.forms)-before)
	}
}
