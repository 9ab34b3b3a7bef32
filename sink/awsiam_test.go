package sink

import (
	"context"
	"encoding/json"
	"strings"
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
