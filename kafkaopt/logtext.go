package kafkaopt

import (
	"regexp"
	"strings"
	"unicode"
)

var (
	// keyed is a credential after its name: client_secret=…, token=…,
	// PASSWORD: … (with a colon only the bare name: "ExpiredToken: …" is
	// prose).
	keyed      = regexp.MustCompile(`(?i)\b([a-z0-9_.-]*(?:password|passwd|secret|token|api[_-]?key|access[_-]?key))(\s*=\s*)\S+`)
	keyedColon = regexp.MustCompile(`(?i)\b(password|passwd|pwd|secret|token)(\s*:\s*)\S+`)
	// scheme is a credential after an HTTP authorization scheme.
	scheme = regexp.MustCompile(`(?i)\b(bearer|basic)\s+\S+`)
	// tokenish is a long word of letters and digits (a JWT, an access key).
	tokenish = regexp.MustCompile(`[A-Za-z0-9+/=_.\-]{20,}`)
)

// LogText makes text from outside (a failed password command's standard
// error, an identity provider's error description) fit for the log: it may
// echo what it was given or carry escape sequences and forged log lines. Control characters become spaces, and credentials
// (a value after password=, token:, Bearer …, or a long word of letters
// and digits) become [redacted]; the words of the message stay.
func LogText(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	s = strings.Join(strings.Fields(s), " ")
	s = keyed.ReplaceAllString(s, "$1$2[redacted]")
	s = keyedColon.ReplaceAllString(s, "$1$2[redacted]")
	s = scheme.ReplaceAllString(s, "$1 [redacted]")
	return tokenish.ReplaceAllStringFunc(s, func(w string) string {
		if strings.ContainsAny(w, "0123456789") && strings.IndexFunc(w, unicode.IsLetter) >= 0 {
			return "[redacted]"
		}
		return w
	})
}
