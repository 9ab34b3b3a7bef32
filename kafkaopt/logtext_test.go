package kafkaopt

import "testing"

func TestLogText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"ExpiredToken: refresh your SSO session\n", "ExpiredToken: refresh your SSO session"},
		{"a\r\nb\x1b[31mc\x00d", "a b [31mc d"},
		{"token=abc password = hunter2 PWD: x client_secret=y", "token=[redacted] password = [redacted] PWD: [redacted] client_secret=[redacted]"},
		{"Authorization: Bearer eyJhbGciOi.x.y", "Authorization: Bearer [redacted]"},
		{"key AKIAIOSFODNN7EXAMPLE rejected", "key [redacted] rejected"},
		{"xxxxxxxxxxxxxxxxxxxxxxxxEND", "xxxxxxxxxxxxxxxxxxxxxxxxEND"}, // letters only: prose
		{"bad \xff byte", "bad ? byte"},
	} {
		if got := LogText(tc.in); got != tc.want {
			t.Errorf("LogText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
