package kafkaopt_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
)

// pki is a CA with a server certificate for 127.0.0.1 and a client
// certificate, written to files as the connector reads them.
type pki struct {
	ca                    *testenv.TestCA
	caFile                string
	server                tls.Certificate
	clientCert, clientKey string // files
}

func newPKI(t *testing.T, hosts ...string) pki {
	t.Helper()
	ca, err := testenv.NewTestCA()
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.ServerCert(hosts...)
	if err != nil {
		t.Fatal(err)
	}
	server, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cCert, cKey, err := ca.ClientCert("outbox-cdc")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := pki{ca: ca, server: server,
		caFile:     filepath.Join(dir, "ca.pem"),
		clientCert: filepath.Join(dir, "client.pem"),
		clientKey:  filepath.Join(dir, "client.key"),
	}
	for path, b := range map[string][]byte{p.caFile: ca.CertPEM, p.clientCert: cCert, p.clientKey: cKey} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// authTopic is the fake clusters' topic.
const authTopic = "auth-test"

// newCluster is a one-broker fake cluster with opts, closed with the test.
func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(1, authTopic)}, opts...)...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// newClient is a client of c with opts, closed with the test; its
// requests are not retried for long.
func newClient(t *testing.T, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.ClientID("auth-test")}, opts...)...)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// serverTLS is the broker side: the server certificate, and client
// certificates required and verified when mutual is set.
func (p pki) serverTLS(mutual bool) *tls.Config {
	c := &tls.Config{Certificates: []tls.Certificate{p.server}, MinVersion: tls.VersionTLS12}
	if mutual {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = p.ca.Pool()
	}
	return c
}

// securePing pings c with sec's options and a short timeout (failures
// are not retried for long).
func securePing(t *testing.T, c *kfake.Cluster, sec kafkaopt.Security) error {
	t.Helper()
	opts, err := kafkaopt.SecurityOpts(sec)
	if err != nil {
		t.Fatalf("SecurityOpts: %v", err)
	}
	return pingAddr(t, c.ListenAddrs()[0], opts...)
}

func TestSecurityOptsNone(t *testing.T) {
	opts, err := kafkaopt.SecurityOpts(kafkaopt.Security{})
	if err != nil || len(opts) != 0 {
		t.Fatalf("SecurityOpts(zero) = %d options, %v", len(opts), err)
	}
}

func TestTLSConfig(t *testing.T) {
	p := newPKI(t)
	cfg, err := kafkaopt.TLSConfig(kafkaopt.TLS{CAFile: p.caFile, CertFile: p.clientCert, KeyFile: p.clientKey, ServerName: "kafka.internal"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MinVersion != tls.VersionTLS12 || cfg.ServerName != "kafka.internal" || cfg.InsecureSkipVerify ||
		len(cfg.Certificates) != 1 || cfg.RootCAs == nil || !cfg.RootCAs.Equal(p.ca.Pool()) {
		t.Errorf("unexpected config %+v", cfg)
	}
	// No CA file: the system roots (RootCAs nil).
	cfg, err = kafkaopt.TLSConfig(kafkaopt.TLS{InsecureSkipVerify: true})
	if err != nil || cfg.RootCAs != nil || !cfg.InsecureSkipVerify || len(cfg.Certificates) != 0 {
		t.Errorf("TLSConfig(skip verify) = %+v, %v", cfg, err)
	}

	keyPEM, _ := os.ReadFile(p.clientKey)
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := newPKI(t)
	for name, tc := range map[string]struct {
		tls  kafkaopt.TLS
		want string
	}{
		"missing CA":       {kafkaopt.TLS{CAFile: "/nonexistent/ca.pem"}, "kafka.tls.ca_file"},
		"CA not PEM":       {kafkaopt.TLS{CAFile: notPEM}, "no PEM certificate"},
		"cert without key": {kafkaopt.TLS{CertFile: p.clientCert}, "kafka.tls.key_file: required when kafka.tls.cert_file is set"},
		"key without cert": {kafkaopt.TLS{KeyFile: p.clientKey}, "kafka.tls.cert_file: required when kafka.tls.key_file is set"},
		"key mismatch":     {kafkaopt.TLS{CertFile: p.clientCert, KeyFile: other.clientKey}, "kafka.tls.key_file"},
		"key as cert":      {kafkaopt.TLS{CertFile: p.clientKey, KeyFile: p.clientKey}, "kafka.tls.cert_file"},
	} {
		_, err := kafkaopt.TLSConfig(tc.tls)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", name, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), string(keyPEM[30:60])) {
			t.Errorf("%s: error shows key material: %v", name, err)
		}
	}
}

// TestCheckTLS: every unusable setting is reported at once, with the key
// that holds it, and what TLSConfig accepts CheckTLS does too.
func TestCheckTLS(t *testing.T) {
	p := newPKI(t)
	if got := kafkaopt.CheckTLS(kafkaopt.TLS{CAFile: p.caFile, CertFile: p.clientCert, KeyFile: p.clientKey}); len(got) != 0 {
		t.Errorf("good files: %v", got)
	}
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	got := kafkaopt.CheckTLS(kafkaopt.TLS{CAFile: dir, CertFile: missing, KeyFile: p.caFile})
	want := []kafkaopt.TLSProblem{
		{Key: "kafka.tls.ca_file", Value: dir, Problem: "not a regular file"},
		{Key: "kafka.tls.cert_file", Value: missing, Problem: "file does not exist"},
		{Key: "kafka.tls.key_file", Value: p.caFile, Problem: "holds no PEM private key (PKCS#1, PKCS#8 or EC; encrypted keys are not supported)"},
	}
	if len(got) != len(want) {
		t.Fatalf("CheckTLS = %v, want %v", got, want)
	}
	for i := range want {
		if got[i].Key != want[i].Key || got[i].Value != want[i].Value || got[i].Problem != want[i].Problem || got[i].Fix == "" {
			t.Errorf("problem %d = %+v, want %+v with a fix", i, got[i], want[i])
		}
	}
	other := newPKI(t)
	got = kafkaopt.CheckTLS(kafkaopt.TLS{CertFile: p.clientCert, KeyFile: other.clientKey})
	if len(got) != 1 || got[0].Key != "kafka.tls.key_file" || !strings.HasPrefix(got[0].Problem, "does not go with kafka.tls.cert_file: ") {
		t.Errorf("mismatched key: %v", got)
	}
	got = kafkaopt.CheckTLS(kafkaopt.TLS{CertFile: p.clientCert, ServerName: "kafka:9093"})
	if len(got) != 2 || got[0].Key != "kafka.tls.key_file" || got[0].Value != "" || got[1].Key != "kafka.tls.server_name" ||
		got[1].Value != "kafka:9093" || got[1].Problem != "not a host name" {
		t.Errorf("certificate without key, server name with port: %v", got)
	}
	if got := kafkaopt.CheckTLS(kafkaopt.TLS{ServerName: "::1"}); len(got) != 0 {
		t.Errorf("IP address as server name: %v", got)
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	if pw, err := kafkaopt.ReadSecretFile(write("pw", "s3cret\r\n\n")); pw != "s3cret" || err != nil {
		t.Errorf("ReadSecretFile = %q, %v", string(pw), err)
	}
	for path, want := range map[string]string{
		write("empty", "\n"):                        "is empty",
		write("big", strings.Repeat("x", 64<<10+1)): "larger than 65536 bytes, not a password",
		filepath.Join(dir, "missing"):               "file does not exist",
		dir:                                         "not a regular file",
	} {
		if _, err := kafkaopt.ReadSecretFile(path); err == nil || err.Error() != want {
			t.Errorf("ReadSecretFile(%s) = %v, want %q", path, err, want)
		}
	}
}

func TestSASLMechanism(t *testing.T) {
	const pw = "sasl-secret-4242"
	for _, m := range []string{kafkaopt.MechanismPlain, kafkaopt.MechanismScramSHA256, kafkaopt.MechanismScramSHA512} {
		mech, err := kafkaopt.SASLMechanism(kafkaopt.SASL{Mechanism: m, Username: "alice", Password: pw})
		if err != nil || mech.Name() != m {
			t.Errorf("%s: mechanism %v, %v", m, mech, err)
		}
	}
	for name, s := range map[string]kafkaopt.SASL{
		"unknown":     {Mechanism: "GSSAPI", Username: "alice", Password: pw},
		"lower case":  {Mechanism: "scram-sha-512", Username: "alice", Password: pw},
		"no user":     {Mechanism: kafkaopt.MechanismPlain, Password: pw},
		"no password": {Mechanism: kafkaopt.MechanismPlain, Username: "alice"},
	} {
		_, err := kafkaopt.SASLMechanism(s)
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), pw) {
			t.Errorf("%s: error shows the password: %v", name, err)
		}
		if _, err := kafkaopt.SecurityOpts(kafkaopt.Security{SASL: &s}); err == nil {
			t.Errorf("%s: SecurityOpts accepted", name)
		}
	}
	s := kafkaopt.SASL{Mechanism: kafkaopt.MechanismScramSHA512, Username: "alice", Password: pw}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		for _, v := range []any{s, &s, kafkaopt.Security{SASL: &s}} {
			if out := fmt.Sprintf(verb, v); strings.Contains(out, pw) {
				t.Errorf("%s of %T shows the password: %s", verb, v, out)
			}
		}
	}
	if got := s.String(); got != "{mechanism: SCRAM-SHA-512, username: alice, password: xxxxx}" {
		t.Errorf("String() = %s", got)
	}
}

// TestSecureProduce runs the producer against a TLS + SASL fake cluster
// with each mechanism, and checks what must fail does: a wrong password, an
// unknown CA, a missing client certificate, a wrong server name.
func TestSecureProduce(t *testing.T) {
	const pw = "sasl-secret-8086"
	p := newPKI(t)
	trusted := &kafkaopt.TLS{CAFile: p.caFile}
	for _, m := range []string{kafkaopt.MechanismPlain, kafkaopt.MechanismScramSHA256, kafkaopt.MechanismScramSHA512} {
		t.Run(m, func(t *testing.T) {
			c := newCluster(t, kfake.TLS(p.serverTLS(false)), kfake.EnableSASL(), kfake.Superuser(m, "alice", pw))
			good := kafkaopt.Security{TLS: trusted, SASL: &kafkaopt.SASL{Mechanism: m, Username: "alice", Password: pw}}
			opts, err := kafkaopt.SecurityOpts(good)
			if err != nil {
				t.Fatal(err)
			}
			cl := newClient(t, c, opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := cl.Ping(ctx); err != nil {
				t.Fatalf("ping: %v", err)
			}
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: authTopic, Value: []byte(`{"secure":true}`)}).FirstErr(); err != nil {
				t.Fatalf("produce: %v", err)
			}

			wrong := good
			wrong.SASL = &kafkaopt.SASL{Mechanism: m, Username: "alice", Password: "wrong-" + pw}
			err = securePing(t, c, wrong)
			if err == nil {
				t.Fatal("wrong password: ping succeeded")
			}
			if strings.Contains(err.Error(), pw) {
				t.Errorf("wrong password: error shows a password: %v", err)
			}
			t.Logf("wrong password: %v", err)
		})
	}

	c := newCluster(t, kfake.TLS(p.serverTLS(false)), kfake.EnableSASL(), kfake.Superuser(kafkaopt.MechanismScramSHA512, "alice", pw))
	saslOK := &kafkaopt.SASL{Mechanism: kafkaopt.MechanismScramSHA512, Username: "alice", Password: pw}
	other := newPKI(t)
	err := securePing(t, c, kafkaopt.Security{TLS: &kafkaopt.TLS{CAFile: other.caFile}, SASL: saslOK})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("unknown CA: %v", err)
	}
	if err := securePing(t, c, kafkaopt.Security{TLS: &kafkaopt.TLS{InsecureSkipVerify: true}, SASL: saslOK}); err != nil {
		t.Errorf("insecure_skip_verify: %v", err)
	}
	if err := securePing(t, c, kafkaopt.Security{SASL: saslOK}); err == nil {
		t.Error("SASL without TLS reached a TLS listener")
	}
}

func TestSecureProduceMutualTLS(t *testing.T) {
	p := newPKI(t)
	c := newCluster(t, kfake.TLS(p.serverTLS(true)))
	if err := securePing(t, c, kafkaopt.Security{TLS: &kafkaopt.TLS{CAFile: p.caFile, CertFile: p.clientCert, KeyFile: p.clientKey}}); err != nil {
		t.Errorf("with a client certificate: %v", err)
	}
	if err := securePing(t, c, kafkaopt.Security{TLS: &kafkaopt.TLS{CAFile: p.caFile}}); err == nil {
		t.Error("without a client certificate: ping succeeded")
	}
}

func TestSecureServerName(t *testing.T) {
	// The certificate names kafka.test only; the fake broker listens on
	// 127.0.0.1, which is what franz-go verifies unless told otherwise.
	p := newPKI(t, "kafka.test")
	c := newCluster(t, kfake.TLS(p.serverTLS(false)))
	err := securePing(t, c, kafkaopt.Security{TLS: &kafkaopt.TLS{CAFile: p.caFile}})
	var hn x509.HostnameError
	if !errors.As(err, &hn) {
		t.Errorf("without server_name: %v", err)
	}
	if err := securePing(t, c, kafkaopt.Security{TLS: &kafkaopt.TLS{CAFile: p.caFile, ServerName: "kafka.test"}}); err != nil {
		t.Errorf("with server_name: %v", err)
	}
}

func TestSecurityFailure(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("init: %w", kerr.SaslAuthenticationFailed), "kafka.sasl.username and the password"},
		{kerr.UnsupportedSaslMechanism, "kafka.sasl.mechanism"},
		{&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, "kafka.tls.ca_file"},
		{&tls.CertificateVerificationError{Err: x509.HostnameError{Host: "127.0.0.1", Certificate: &x509.Certificate{}}}, "kafka.tls.server_name"},
		{tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, "kafka.tls.enabled"},
		{errors.New("read tcp 127.0.0.1:1->127.0.0.1:2: remote error: tls: certificate required"), "kafka.tls.cert_file"},
		{errors.New("invalid large response size 352518912 > limit 104857600; the first three bytes received appear to be a tls alert record for TLS v1.2; is this a plaintext connection speaking to a tls endpoint?"), "expects TLS"},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), ""},
		{kerr.NotLeaderForPartition, ""},
	} {
		if got := kafkaopt.SecurityFailure(tc.err); (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("SecurityFailure(%v) = %q, want one naming %q", tc.err, got, tc.want)
		}
	}
}

// TestSecurityFailureLog checks that a client that cannot get through TLS
// says so in the log, once per interval, while it retries.
func TestSecurityFailureLog(t *testing.T) {
	p := newPKI(t)
	other := newPKI(t)
	c := newCluster(t, kfake.TLS(p.serverTLS(true)))
	for name, tc := range map[string]struct {
		tls  kafkaopt.TLS
		want string
	}{
		"unknown CA":            {kafkaopt.TLS{CAFile: other.caFile, CertFile: p.clientCert, KeyFile: p.clientKey}, "kafka.tls.ca_file"},
		"no client certificate": {kafkaopt.TLS{CAFile: p.caFile}, "kafka.tls.cert_file"},
	} {
		t.Run(name, func(t *testing.T) {
			var buf syncBuffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			opts, err := kafkaopt.SecurityOpts(kafkaopt.Security{TLS: &tc.tls})
			if err != nil {
				t.Fatal(err)
			}
			cl := newClient(t, c, append(opts, kafkaopt.SecurityFailureLog(log, time.Hour))...)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			for ctx.Err() == nil && strings.Count(buf.String(), "\n") < 1 {
				_ = cl.Ping(ctx)
			}
			_ = cl.Ping(ctx) // more failures within the interval are not logged
			out := buf.String()
			if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, tc.want) || !strings.Contains(out, "retrying") {
				t.Fatalf("log lacks an error naming %s:\n%s", tc.want, out)
			}
			if n := strings.Count(out, "\n"); n != 1 {
				t.Errorf("%d lines logged within the interval, want 1:\n%s", n, out)
			}
		})
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSecurityFailureTextContracts: two of SecurityFailure's cases match an
// error's text (a TLS alert over TCP is an unexported type; franz-go's
// reading of an alert is its own message): the real handshakes against
// kfake, with the pinned franz-go and Go, produce text that they match.
func TestSecurityFailureTextContracts(t *testing.T) {
	p := newPKI(t)
	// A TLS listener answering a plaintext request with an alert record, as
	// a Java broker does (kfake and Go's crypto/tls close the connection
	// without one): level fatal, handshake_failure.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // the listener closed at the end of the test
			}
			_, _ = conn.Read(make([]byte, 512))
			_, _ = conn.Write([]byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28})
			conn.Close()
		}
	}()
	plain := pingAddr(t, ln.Addr().String())
	if got := kafkaopt.SecurityFailure(plain); !strings.Contains(got, "expects TLS") {
		t.Errorf("plaintext to a TLS listener: %v classified %q, want it to say the broker expects TLS", plain, got)
	}
	noCert := securePing(t, newCluster(t, kfake.TLS(p.serverTLS(true))), kafkaopt.Security{TLS: &kafkaopt.TLS{CAFile: p.caFile}})
	if got := kafkaopt.SecurityFailure(noCert); !strings.Contains(got, "kafka.tls.cert_file") {
		t.Errorf("no client certificate: %v classified %q, want kafka.tls.cert_file named", noCert, got)
	}
}

// pingAddr pings the broker at addr with opts and a short timeout.
func pingAddr(t *testing.T, addr string, opts ...kgo.Opt) error {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.ClientID("auth-test"), kgo.RequestRetries(1)}, opts...)...)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return cl.Ping(ctx)
}
