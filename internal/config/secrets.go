package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strings"
)

// secretKeys are the keys whose value is a secret: never shown in a message,
// redacted by String, LogValue and MarshalJSON. (postgres.dsn is a connection
// string with a password inside; RedactDSN handles it.)
var secretKeys = map[string]bool{
	"kafka.sasl.password": true,
}

// holdsSecret reports whether key is a secret key or a section that holds
// one, so a value written there must not be shown in an error.
func holdsSecret(key string) bool {
	for k := range secretKeys {
		if k == key || strings.HasPrefix(k, key+".") {
			return true
		}
	}
	return false
}

// maxSecretFileSize bounds a password file: anything larger is a mistake
// (a key or a directory listing), not a password.
const maxSecretFileSize = 64 << 10

// readSecretFile reads a password file: the whole content minus trailing
// newlines (\n or \r\n, as editors and `echo` leave them). Its errors name
// the file, never its content.
func readSecretFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fileProblem(err)
	}
	if !fi.Mode().IsRegular() {
		return "", errors.New("not a regular file")
	}
	if fi.Size() > maxSecretFileSize {
		return "", fmt.Errorf("larger than %d bytes, not a password", maxSecretFileSize)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fileProblem(err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", errors.New("is empty")
	}
	return s, nil
}

// fileProblem turns a file error into a short reason without the path
// (FieldError.Value already shows it).
func fileProblem(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errors.New("file does not exist")
	case errors.Is(err, fs.ErrPermission):
		return errors.New("file is not readable by this process (permission denied)")
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// FilePassword returns the password read from postgres.password_file now,
// or "" when the key is not set. The caller puts it into the connection
// settings, never into the DSN string.
func (p Postgres) FilePassword() (string, error) {
	if p.PasswordFile == "" {
		return "", nil
	}
	pw, err := readSecretFile(p.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("postgres.password_file %s: %w", p.PasswordFile, err)
	}
	return pw, nil
}

// Secret returns the SASL password: kafka.sasl.password, or the content of
// kafka.sasl.password_file read now.
func (s KafkaSASL) Secret() (string, error) {
	if s.PasswordFile == "" {
		return s.Password, nil
	}
	pw, err := readSecretFile(s.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("kafka.sasl.password_file %s: %w", s.PasswordFile, err)
	}
	return pw, nil
}

// String renders the section with the password redacted.
func (s KafkaSASL) String() string {
	c := Config{Kafka: Kafka{SASL: s}}
	return renderFlow(&c, section("kafka.sasl"))
}

// GoString keeps %#v from printing the password.
func (s KafkaSASL) GoString() string { return "config.KafkaSASL" + s.String() }

// LogValue keeps slog from printing the password.
func (s KafkaSASL) LogValue() slog.Value {
	c := Config{Kafka: Kafka{SASL: s}}
	return slog.GroupValue(logAttrs(&c, section("kafka.sasl"))...)
}

// MarshalJSON keeps encoding/json from printing the password.
func (s KafkaSASL) MarshalJSON() ([]byte, error) {
	c := Config{Kafka: Kafka{SASL: s}}
	return json.Marshal(asMap(&c, section("kafka.sasl")))
}

// String renders the section with the SASL password redacted.
func (k Kafka) String() string {
	c := Config{Kafka: k}
	return renderFlow(&c, section("kafka"))
}

// GoString keeps %#v from printing the SASL password.
func (k Kafka) GoString() string { return "config.Kafka" + k.String() }

// LogValue keeps slog from printing the SASL password.
func (k Kafka) LogValue() slog.Value {
	c := Config{Kafka: k}
	return slog.GroupValue(logAttrs(&c, section("kafka"))...)
}

// MarshalJSON keeps encoding/json from printing the SASL password.
func (k Kafka) MarshalJSON() ([]byte, error) {
	c := Config{Kafka: k}
	return json.Marshal(asMap(&c, section("kafka")))
}

// Warning is a setting that is accepted but weakens security. The command
// line logs each one at start.
type Warning struct {
	Key     string
	Message string
}

// Warnings lists the accepted but unsafe settings of a valid configuration.
func (c *Config) Warnings() []Warning {
	var out []Warning
	t, s := c.Kafka.TLS, c.Kafka.SASL
	if t.Enabled && t.InsecureSkipVerify {
		out = append(out, Warning{"kafka.tls.insecure_skip_verify",
			"broker certificates are not verified: anyone on the network path can impersonate the brokers; set a CA with kafka.tls.ca_file instead"})
	}
	if s.Mechanism == SASLPlain && !t.Enabled {
		out = append(out, Warning{"kafka.sasl.mechanism",
			"SASL PLAIN without TLS sends the password in clear text; set kafka.tls.enabled: true"})
	}
	return out
}

var (
	// keywordHasPasswordRE finds a password keyword (not sslpassword) in
	// the keyword=value form.
	keywordHasPasswordRE = regexp.MustCompile(`(?i)(^|\s)password\s*=`)
)

// dsnHasPassword reports whether the DSN carries a password of its own, in
// the URL's user info, as a password query parameter or as a password
// keyword.
func dsnHasPassword(dsn string) bool {
	if !isURLForm(dsn) {
		return keywordHasPasswordRE.MatchString(dsn)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return false // reported as an invalid DSN already
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			return true
		}
	}
	for k := range u.Query() {
		if strings.EqualFold(k, "password") {
			return true
		}
	}
	return false
}

// checkCAFile reports why a CA bundle cannot be used, or "".
func checkCAFile(path string) string {
	b, err := readPEMFile(path)
	if err != nil {
		return err.Error()
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return "holds no PEM certificate"
	}
	return ""
}

// checkKeyPair reports why a client certificate and key cannot be used, or
// "". The messages never include key material.
func checkKeyPair(certFile, keyFile string) (certProblem, keyProblem, pairProblem string) {
	cert, err := readPEMFile(certFile)
	if err != nil {
		certProblem = err.Error()
	} else if !hasPEMBlock(cert, "CERTIFICATE") {
		certProblem = "holds no PEM certificate"
	}
	key, err := readPEMFile(keyFile)
	if err != nil {
		keyProblem = err.Error()
	} else if !hasPEMBlock(key, "PRIVATE KEY") {
		keyProblem = "holds no PEM private key (PKCS#1, PKCS#8 or EC; encrypted keys are not supported)"
	}
	if certProblem != "" || keyProblem != "" {
		return
	}
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		pairProblem = strings.TrimPrefix(err.Error(), "tls: ")
	}
	return
}

// readPEMFile reads a certificate or key file, with short reasons.
func readPEMFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fileProblem(err)
	}
	if !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fileProblem(err)
	}
	return b, nil
}

// hasPEMBlock reports whether b holds a PEM block whose type ends with
// suffix (CERTIFICATE; PRIVATE KEY matches RSA/EC/plain PRIVATE KEY).
func hasPEMBlock(b []byte, suffix string) bool {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return false
		}
		if strings.HasSuffix(blk.Type, suffix) && !strings.Contains(blk.Type, "ENCRYPTED") {
			return true
		}
	}
}
