package testenv

import (
	"context"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

var kafkaUserRE = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// check validates the options before anything is started; a nil
// *KafkaSecurity is valid (no SASL_SSL listener).
func (s *KafkaSecurity) check() error {
	if s == nil {
		return nil
	}
	if len(s.CertPEM) == 0 || len(s.KeyPEM) == 0 {
		return errors.New("kafka security: CertPEM and KeyPEM are required")
	}
	if _, err := tls.X509KeyPair(s.CertPEM, s.KeyPEM); err != nil {
		return fmt.Errorf("kafka security: certificate and key: %w", err)
	}
	if len(s.SCRAMUsers) == 0 {
		return errors.New("kafka security: SCRAMUsers is empty, nobody could authenticate")
	}
	for user, pw := range s.SCRAMUsers {
		if !kafkaUserRE.MatchString(user) {
			return fmt.Errorf("kafka security: user name %q: use letters, digits, '.', '_' and '-'", user)
		}
		if pw == "" || strings.ContainsAny(pw, "\"\\") || strings.ContainsFunc(pw, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return fmt.Errorf("kafka security: the password of %s is empty or has '\"', '\\' or a control character", user)
		}
	}
	return nil
}

// securityProperties are the server.properties entries of the SASL_SSL
// listener. The PLAINTEXT listener stays: the harness's readiness probe,
// Brokers() and inter-broker traffic use it.
func (k *Kafka) securityProperties() map[string]string {
	const l = "listener.name.sasl_ssl."
	users := slices.Sorted(maps.Keys(k.security.SCRAMUsers))
	var plain strings.Builder
	plain.WriteString("org.apache.kafka.common.security.plain.PlainLoginModule required")
	for _, u := range users {
		fmt.Fprintf(&plain, " user_%s=\"%s\"", u, k.security.SCRAMUsers[u])
	}
	plain.WriteString(";")
	return map[string]string{
		"listeners": fmt.Sprintf("PLAINTEXT://%s,CONTROLLER://%s,SASL_SSL://%s",
			k.addr(), k.ctrlAddr(), k.secureAddr()),
		"advertised.listeners":               fmt.Sprintf("PLAINTEXT://%s,SASL_SSL://%s", k.addr(), k.secureAddr()),
		"listener.security.protocol.map":     "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
		l + "sasl.enabled.mechanisms":        strings.Join(kafkaSASLMechanisms, ","),
		l + "scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
		l + "scram-sha-256.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
		l + "plain.sasl.jaas.config":         plain.String(),
		// A PEM file with the unencrypted PKCS#8 key and the certificate
		// chain; no key password.
		l + "ssl.keystore.type":     "PEM",
		l + "ssl.keystore.location": k.keystore,
		l + "ssl.client.auth":       "none",
	}
}

// scramArgs are the kafka-storage format arguments that add the SCRAM
// credentials of every user, as salted hashes so no password is on a
// command line.
func (s *KafkaSecurity) scramArgs() ([]string, error) {
	if s == nil {
		return nil, nil
	}
	var args []string
	for _, user := range slices.Sorted(maps.Keys(s.SCRAMUsers)) {
		for _, m := range []struct {
			name string
			h    func() hash.Hash
			size int
		}{{"SCRAM-SHA-256", sha256.New, sha256.Size}, {"SCRAM-SHA-512", sha512.New, sha512.Size}} {
			salt := make([]byte, 16)
			if _, err := rand.Read(salt); err != nil {
				return nil, err
			}
			salted, err := pbkdf2.Key(m.h, s.SCRAMUsers[user], salt, scramIterations, m.size)
			if err != nil {
				return nil, fmt.Errorf("scram credential for %s: %w", user, err)
			}
			args = append(args, "--add-scram", fmt.Sprintf(`%s=[name=%s,iterations=%d,salt="%s",saltedpassword="%s"]`,
				m.name, user, scramIterations,
				base64.StdEncoding.EncodeToString(salt), base64.StdEncoding.EncodeToString(salted)))
		}
	}
	return args, nil
}

// SecureClientOpts returns client options for the SASL_SSL listener: TLS
// trusting roots (the CA that issued KafkaSecurity.CertPEM) and SCRAM-SHA-512
// as user, whose password comes from KafkaSecurity.SCRAMUsers.
func (k *Kafka) SecureClientOpts(roots *x509.CertPool, user string) ([]kgo.Opt, error) {
	if k.security == nil {
		return nil, errors.New("kafka: started without Security")
	}
	pw, ok := k.security.SCRAMUsers[user]
	if !ok {
		return nil, fmt.Errorf("kafka: no SCRAM user %q", user)
	}
	return []kgo.Opt{
		kgo.SeedBrokers(k.SecureBrokers()...),
		kgo.DialTLSConfig(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}),
		kgo.SASL(scram.Auth{User: user, Pass: pw}.AsSha512Mechanism()),
	}, nil
}

// waitSecureReady polls until a user authenticates on the SASL_SSL
// listener; the SCRAM credentials reach the broker with the metadata log,
// a moment after the PLAINTEXT listener answers. The broker's certificate
// is not verified here (the harness does not know the CA): the probe is
// about the listener being up, the tests check verification.
func (k *Kafka) waitSecureReady(ctx context.Context) error {
	user := slices.Sorted(maps.Keys(k.security.SCRAMUsers))[0]
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(k.secureAddr()),
		kgo.DialTLSConfig(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}), //nolint:gosec // readiness probe only
		kgo.SASL(scram.Auth{User: user, Pass: k.security.SCRAMUsers[user]}.AsSha512Mechanism()),
	)
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
		_, err := adm.ListBrokers(actx)
		cancel()
		if err == nil {
			return nil
		}
		if serr := sleepCtx(ctx, 100*time.Millisecond); serr != nil {
			return fmt.Errorf("kafka SASL_SSL listener not ready: %w (last error: %v)", serr, err)
		}
	}
}
