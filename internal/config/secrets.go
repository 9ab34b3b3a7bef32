package config

import (
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
)

// DSN is a libpq connection string. However it is printed (every fmt verb,
// %#v included; encoding/json, YAML and other TextMarshaler users; slog) it
// shows as RedactDSN makes it, like kafkaopt.Secret. string(d) is the connection
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
		return keywordPasswordRE.ReplaceAllString(dsn, "${1}"+kafkaopt.Redacted)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		scheme, rest, _ := strings.Cut(dsn, "://")
		if i := strings.LastIndexByte(rest, '@'); i >= 0 {
			rest = kafkaopt.Redacted + rest[i:]
		}
		return scheme + "://" + queryPasswordRE.ReplaceAllString(rest, "${1}"+kafkaopt.Redacted)
	}
	u.RawQuery = queryPasswordRE.ReplaceAllString(u.RawQuery, "${1}"+kafkaopt.Redacted)
	u.Fragment, u.RawFragment = "", ""
	return u.Redacted() // its password as xxxxx, like kafkaopt.Redacted
}

// dsnProblem checks that dsn is a well-formed connection string. It never
// includes the DSN, or parser messages that may quote it, in its answer.
func dsnProblem(dsn string) string {
	switch _, err := url.Parse(dsn); {
	case !isURLForm(dsn) && !keywordDSNRE.MatchString(dsn):
		return "neither a postgres:// URL nor a list of keyword=value settings"
	case isURLForm(dsn) && err != nil:
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
	_, has := u.User.Password()
	for k := range u.Query() {
		has = has || strings.EqualFold(k, "password")
	}
	return has
}
