package testenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

func TestTestCA(t *testing.T) {
	ca, err := NewTestCA()
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.ServerCert()
	if err != nil {
		t.Fatal(err)
	}
	if blk, _ := pem.Decode(keyPEM); blk == nil || blk.Type != "PRIVATE KEY" {
		t.Fatalf("key is not PKCS#8 PEM: %q", keyPEM)
	}
	blk, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"localhost", "127.0.0.1"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: ca.Pool()}); err != nil {
			t.Errorf("server cert for %s: %v", host, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "example.com", Roots: ca.Pool()}); err == nil {
		t.Error("server cert verifies for example.com")
	}
	other, _ := NewTestCA()
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "localhost", Roots: other.Pool()}); err == nil {
		t.Error("server cert verifies against another CA")
	}

	// A TLS handshake with a client certificate, both ways verified.
	serverCert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cCert, cKey, err := ca.ClientCert("alice")
	if err != nil {
		t.Fatal(err)
	}
	clientCert, err := tls.X509KeyPair(cCert, cKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{serverCert}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			peer <- err.Error()
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			peer <- err.Error()
			return
		}
		peer <- tc.ConnectionState().PeerCertificates[0].Subject.CommonName
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{clientCert}})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if got := <-peer; got != "alice" {
		t.Fatalf("server saw client %q", got)
	}

	// pkcs8Key passes PKCS#8 through and rejects what is not a key.
	if k, err := pkcs8Key(keyPEM); err != nil || string(k) != string(keyPEM) {
		t.Errorf("pkcs8Key(PKCS#8) = %v", err)
	}
	if _, err := pkcs8Key(certPEM); err == nil {
		t.Error("pkcs8Key accepted a certificate")
	}
}

func TestKafkaSecurityCheck(t *testing.T) {
	ca, _ := NewTestCA()
	cert, key, _ := ca.ServerCert()
	for name, s := range map[string]*KafkaSecurity{
		"no cert":       {KeyPEM: key, SCRAMUsers: map[string]string{"a": "b"}},
		"mismatch":      {CertPEM: cert, KeyPEM: mustKey(t, ca), SCRAMUsers: map[string]string{"a": "b"}},
		"no users":      {CertPEM: cert, KeyPEM: key},
		"bad user":      {CertPEM: cert, KeyPEM: key, SCRAMUsers: map[string]string{"a b": "pw"}},
		"quote in pw":   {CertPEM: cert, KeyPEM: key, SCRAMUsers: map[string]string{"a": `p"w`}},
		"newline in pw": {CertPEM: cert, KeyPEM: key, SCRAMUsers: map[string]string{"a": "p\nw"}},
	} {
		if err := s.check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ok := &KafkaSecurity{CertPEM: cert, KeyPEM: key, SCRAMUsers: map[string]string{"alice": "p@ss w0rd,]="}}
	if err := ok.check(); err != nil {
		t.Fatal(err)
	}
	args, err := ok.scramArgs()
	if err != nil || len(args) != 4 || strings.Contains(strings.Join(args, " "), "p@ss") {
		t.Fatalf("scramArgs = %q, %v (want two salted credentials, no password)", args, err)
	}
}

func mustKey(t *testing.T, ca *TestCA) []byte {
	t.Helper()
	_, k, err := ca.ServerCert("other")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestPostgresTLS starts a server with TLS and a password role and checks
// verify-full works with the CA, fails with another CA, and that the role
// cannot connect without TLS or with a wrong password.
func TestPostgresTLS(t *testing.T) {
	if os.Getenv(EnvPGDSN) != "" {
		t.Skip("TLS needs a managed server; " + EnvPGDSN + " is set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca, err := NewTestCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.ServerCert()
	if err != nil {
		t.Fatal(err)
	}
	pg, err := StartPostgres(ctx, PostgresOptions{TLS: &PostgresTLS{CertPEM: cert, KeyPEM: key, PasswordRoles: []string{"tls_user"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()

	// The key file is private to the server's user.
	fi, err := os.Stat(filepath.Join(pg.DataDir(), "server.key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("server.key: %v, mode %v", err, fi.Mode())
	}

	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	otherCA, _ := NewTestCA()
	otherFile := filepath.Join(dir, "other.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(otherFile, otherCA.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	const pw = "tls-user-pw-7f3a"
	admin, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE ROLE tls_user LOGIN REPLICATION PASSWORD '"+pw+"'"); err != nil {
		t.Fatal(err)
	}

	withPW := func(dsn, pw string) string { return strings.Replace(dsn, "tls_user@", "tls_user:"+pw+"@", 1) }
	good := withPW(pg.TLSDSN("postgres", "tls_user", caFile), pw)
	conn, err := pgx.Connect(ctx, good)
	if err != nil {
		t.Fatalf("verify-full with the CA: %v", err)
	}
	var ssl bool
	if err := conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
		t.Errorf("pg_stat_ssl.ssl = %v, %v", ssl, err)
	}
	conn.Close(ctx)

	for name, dsn := range map[string]string{
		"another CA":     withPW(pg.TLSDSN("postgres", "tls_user", otherFile), pw),
		"wrong password": withPW(pg.TLSDSN("postgres", "tls_user", caFile), "nope"),
		"no TLS":         strings.Replace(pg.DSN("postgres"), "postgres@", "tls_user:"+pw+"@", 1),
	} {
		c, err := pgx.Connect(ctx, dsn)
		if err == nil {
			c.Close(ctx)
			t.Errorf("%s: connected", name)
			continue
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("%s: error shows the password: %v", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
	// The superuser keeps connecting without TLS (the harness relies on it),
	// and survives a restart with ssl on.
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := pgx.Connect(ctx, good); err != nil {
		t.Fatalf("after restart: %v", err)
	} else {
		c.Close(ctx)
	}
}

// TestKafkaSecurity starts a broker with a SASL_SSL listener and checks every
// mechanism, certificate verification, a wrong password and that the
// PLAINTEXT listener stays. It starts a JVM, so -short skips it.
func TestKafkaSecurity(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kafka broker")
	}
	if os.Getenv(EnvKafkaBrokers) != "" {
		t.Skip("needs a managed broker; " + EnvKafkaBrokers + " is set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ca, err := NewTestCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.ServerCert()
	if err != nil {
		t.Fatal(err)
	}
	const pw = "alice-pw-9c1e"
	k, err := StartKafka(ctx, KafkaOptions{Security: &KafkaSecurity{CertPEM: cert, KeyPEM: key, SCRAMUsers: map[string]string{"alice": pw}}})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if len(k.SecureBrokers()) != 1 || k.SecureBrokers()[0] == k.Brokers()[0] {
		t.Fatalf("SecureBrokers() = %v, Brokers() = %v", k.SecureBrokers(), k.Brokers())
	}
	conf, err := os.Stat(k.confPath)
	if err != nil || conf.Mode().Perm() != 0o600 {
		t.Fatalf("server.properties: %v %v", err, conf.Mode())
	}

	ping := func(tlsCfg *tls.Config, m sasl.Mechanism, brokers []string) error {
		opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.RequestRetries(0)}
		if tlsCfg != nil {
			opts = append(opts, kgo.DialTLSConfig(tlsCfg))
		}
		if m != nil {
			opts = append(opts, kgo.SASL(m))
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return err
		}
		defer cl.Close()
		pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		_, err = kadm.NewClient(cl).ListBrokers(pctx)
		return err
	}
	trusted := &tls.Config{RootCAs: ca.Pool()}
	for name, m := range map[string]sasl.Mechanism{
		"SCRAM-SHA-512": scram.Auth{User: "alice", Pass: pw}.AsSha512Mechanism(),
		"SCRAM-SHA-256": scram.Auth{User: "alice", Pass: pw}.AsSha256Mechanism(),
		"PLAIN":         plain.Auth{User: "alice", Pass: pw}.AsMechanism(),
	} {
		if err := ping(trusted, m, k.SecureBrokers()); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	opts, err := k.SecureClientOpts(ca.Pool(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Ping(ctx); err != nil {
		t.Errorf("SecureClientOpts: %v", err)
	}
	cl.Close()

	err = ping(trusted, scram.Auth{User: "alice", Pass: "wrong"}.AsSha512Mechanism(), k.SecureBrokers())
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authentication") {
		t.Errorf("wrong password: %v", err)
	}
	other, _ := NewTestCA()
	err = ping(&tls.Config{RootCAs: other.Pool()}, scram.Auth{User: "alice", Pass: pw}.AsSha512Mechanism(), k.SecureBrokers())
	var uae x509.UnknownAuthorityError
	if !errors.As(err, &uae) && (err == nil || !strings.Contains(err.Error(), "certificate")) {
		t.Errorf("another CA: %v", err)
	}
	if err := ping(nil, nil, k.Brokers()); err != nil {
		t.Errorf("PLAINTEXT listener: %v", err)
	}
	// Plaintext to the SASL_SSL port does not get in.
	if c, err := net.DialTimeout("tcp", k.SecureBrokers()[0], time.Second); err == nil {
		c.Close()
	}
	if err := ping(nil, scram.Auth{User: "alice", Pass: pw}.AsSha512Mechanism(), k.SecureBrokers()); err == nil {
		t.Error("SASL without TLS got in on the SASL_SSL listener")
	}
}
