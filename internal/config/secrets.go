package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/sink"
)

// DSN is a libpq connection string. However it is printed (every fmt verb,
// %#v included; encoding/json, YAML and other TextMarshaler users; slog) it
// shows as RedactDSN makes it, like sink.Secret. string(d) is the connection
// string itself, for the code that connects.
type DSN string

func (d DSN) String() string { return RedactDSN(string(d)) }

// Format applies the verb to the redacted text.
func (d DSN) Format(f fmt.State, verb rune) { fmt.Fprintf(f, fmt.FormatString(f, verb), d.String()) }

func (d DSN) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func (d DSN) LogValue() slog.Value { return slog.StringValue(d.String()) }

var (
	// password=... or sslpassword=... in keyword form; the value is quoted
	// ('...' with \ escapes) or runs to the next unescaped space. An
	// unterminated quote swallows the rest, which errs on the safe side.
	keywordPasswordRE = regexp.MustCompile(`(?i)(\w*password\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.)*)`)
	// password=... as a URL query parameter.
	queryPasswordRE = regexp.MustCompile(`(?i)(\w*password=)[^&#]*`)
	// A password keyword (not sslpassword) in the keyword form.
	keywordHasPasswordRE = regexp.MustCompile(`(?i)(^|\s)password\s*=`)
	// libpq's keyword form: keyword=value pairs, a value single-quoted (with
	// \' and \\ escapes) or running to the next space (with \ escapes).
	keywordDSNRE = regexp.MustCompile(`(?s)^\s*(?:[^=\s]+\s*=\s*(?:'(?:[^'\\]|\\.)*'\s*|(?:[^\s'\\]|\\.)(?:[^\s\\]|\\.)*(?:\s+|$)|$))+$`)
)

func isURLForm(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// RedactDSN returns dsn with every password replaced by xxxxx, in the URL
// form (postgres://user:pw@host/db, and ?password=… or ?sslpassword=… in the
// query) and in the keyword form (password=pw, password='p w'). A URL that
// does not parse keeps only what follows its last @. The result is safe to
// print; it is not meant to be used to connect.
func RedactDSN(dsn string) string {
	if !isURLForm(dsn) {
		return keywordPasswordRE.ReplaceAllString(dsn, "${1}"+sink.Redacted)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		scheme, rest, _ := strings.Cut(dsn, "://")
		if i := strings.LastIndexByte(rest, '@'); i >= 0 {
			rest = sink.Redacted + rest[i:]
		}
		return scheme + "://" + queryPasswordRE.ReplaceAllString(rest, "${1}"+sink.Redacted)
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), sink.Redacted)
	}
	u.RawQuery = queryPasswordRE.ReplaceAllString(u.RawQuery, "${1}"+sink.Redacted)
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// dsnProblem checks that dsn is a well-formed connection string. It never
// includes the DSN, or parser messages that may quote it, in its answer.
func dsnProblem(dsn string) string {
	if !isURLForm(dsn) {
		if !keywordDSNRE.MatchString(dsn) {
			return "neither a postgres:// URL nor a list of keyword=value settings"
		}
	} else if _, err := url.Parse(dsn); err != nil {
		return "not a valid postgres:// URL (check that special characters in the password are percent-encoded)"
	}
	return ""
}

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
	if _, has := u.User.Password(); has {
		return true
	}
	for k := range u.Query() {
		if strings.EqualFold(k, "password") {
			return true
		}
	}
	return false
}

// readSecretFile reads a password file: the whole content minus trailing
// newlines (\n or \r\n, as editors and `echo` leave them). Its errors name
// the file, never its content.
func readSecretFile(path string) (string, error) {
	b, err := readRegularFile(path, maxSecretFileSize)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", errors.New("is empty")
	}
	return s, nil
}

// maxSecretFileSize bounds a password file: anything larger is a mistake (a
// key or a directory listing), not a password.
const maxSecretFileSize = 64 << 10

// readRegularFile reads a password, certificate or key file no larger than
// maxSize (0: any size), with short reasons that leave out the path
// (FieldError.Value already shows it).
func readRegularFile(path string, maxSize int64) ([]byte, error) {
	fi, err := os.Stat(path)
	if err == nil && !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	if err == nil && maxSize > 0 && fi.Size() > maxSize {
		return nil, fmt.Errorf("larger than %d bytes, not a password", maxSize)
	}
	var b []byte
	if err == nil {
		b, err = os.ReadFile(path)
	}
	var pe *fs.PathError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, errors.New("file does not exist")
	case errors.Is(err, fs.ErrPermission):
		return nil, errors.New("file is not readable by this process (permission denied)")
	case errors.As(err, &pe):
		return nil, pe.Err
	}
	return b, err
}

// checkCAFile reports why a CA bundle cannot be used, or "".
func checkCAFile(path string) string {
	b, err := readRegularFile(path, 0)
	if err != nil {
		return err.Error()
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return "holds no PEM certificate"
	}
	return ""
}

// checkKeyPair reports why a client certificate and key cannot be used, or
// "". The messages never include key material.
func checkKeyPair(certFile, keyFile string) (certProblem, keyProblem, pairProblem string) {
	cert, err := readRegularFile(certFile, 0)
	if err != nil {
		certProblem = err.Error()
	} else if !hasPEMBlock(cert, "CERTIFICATE") {
		certProblem = "holds no PEM certificate"
	}
	key, err := readRegularFile(keyFile, 0)
	if err != nil {
		keyProblem = err.Error()
	} else if !hasPEMBlock(key, "PRIVATE KEY") {
		keyProblem = "holds no PEM private key (PKCS#1, PKCS#8 or EC; encrypted keys are not supported)"
	}
	if certProblem == "" && keyProblem == "" {
		if _, err := tls.X509KeyPair(cert, key); err != nil {
			pairProblem = strings.TrimPrefix(err.Error(), "tls: ")
		}
	}
	return
}

// hasPEMBlock reports whether b holds a PEM block whose type ends with
// suffix (CERTIFICATE; PRIVATE KEY matches RSA/EC/plain PRIVATE KEY).
func hasPEMBlock(b []byte, suffix string) bool {
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return false
		}
		if strings.HasSuffix(blk.Type, suffix) && !strings.Contains(blk.Type, "ENCRYPTED") {
			return true
		}
	}
}
