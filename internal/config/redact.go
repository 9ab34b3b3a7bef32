package config

import (
	"net/url"
	"regexp"
	"strings"
)

// redacted replaces a secret in a DSN.
const redacted = "xxxxx"

var (
	// password=... or sslpassword=... in keyword form; the value is quoted
	// ('...' with \ escapes) or runs to the next unescaped space. An
	// unterminated quote swallows the rest, which errs on the safe side.
	keywordPasswordRE = regexp.MustCompile(`(?i)(\w*password\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.)*)`)
	// password=... as a URL query parameter.
	queryPasswordRE = regexp.MustCompile(`(?i)(\w*password=)[^&#]*`)
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
		return keywordPasswordRE.ReplaceAllString(dsn, "${1}"+redacted)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		scheme, rest, _ := strings.Cut(dsn, "://")
		if i := strings.LastIndexByte(rest, '@'); i >= 0 {
			rest = redacted + rest[i:]
		}
		return scheme + "://" + queryPasswordRE.ReplaceAllString(rest, "${1}"+redacted)
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), redacted)
		}
	}
	u.RawQuery = queryPasswordRE.ReplaceAllString(u.RawQuery, "${1}"+redacted)
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// dsnProblem checks that dsn is a well-formed connection string. It never
// includes the DSN, or parser messages that may quote it, in its answer.
func dsnProblem(dsn string) string {
	if isURLForm(dsn) {
		if _, err := url.Parse(dsn); err != nil {
			return "not a valid postgres:// URL (check that special characters in the password are percent-encoded)"
		}
		return ""
	}
	if !validKeywordDSN(dsn) {
		return "neither a postgres:// URL nor a list of keyword=value settings"
	}
	return ""
}

// validKeywordDSN parses libpq's keyword=value form: keywords are separated by
// spaces, a value is either single-quoted (with \' and \\ escapes) or runs to
// the next space (with \ escapes).
func validKeywordDSN(s string) bool {
	i, n, pairs := 0, len(s), 0
	skip := func() {
		for i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
	}
	for {
		skip()
		if i == n {
			return pairs > 0
		}
		start := i
		for i < n && s[i] != '=' && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
			i++
		}
		if i == start {
			return false // "=value" without a keyword
		}
		skip()
		if i == n || s[i] != '=' {
			return false
		}
		i++
		skip()
		if i < n && s[i] == '\'' {
			i++
			closed := false
			for i < n {
				if s[i] == '\\' {
					i += 2
					continue
				}
				if s[i] == '\'' {
					closed = true
					i++
					break
				}
				i++
			}
			if !closed {
				return false
			}
		} else {
			for i < n && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			if i > n {
				return false // trailing backslash
			}
		}
		pairs++
	}
}
