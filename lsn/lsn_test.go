package lsn

import "testing"

func TestParseRoundTrip(t *testing.T) {
	tests := []struct {
		in   string
		want LSN
	}{
		{"0/0", 0},
		{"0/1", 1},
		{"16/B374D848", 0x16B374D848},
		{"FFFFFFFF/FFFFFFFF", ^LSN(0)},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tt.in, err)
		}
		if got != tt.want {
			t.Errorf("Parse(%q) = %d, want %d", tt.in, got, tt.want)
		}
		if s := got.String(); s != tt.in {
			t.Errorf("String() = %q, want %q", s, tt.in)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for _, in := range []string{"", "0", "/", "1/", "/1", "G/0", "123456789/0", "0/123456789", "-1/0"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) succeeded, want error", in)
		}
	}
}

func TestScan(t *testing.T) {
	var l LSN
	if err := l.Scan("1/2"); err != nil || l != 1<<32|2 {
		t.Fatalf("Scan string: %v %v", l, err)
	}
	if err := l.Scan([]byte("A/B")); err != nil || l != 0xA<<32|0xB {
		t.Fatalf("Scan bytes: %v %v", l, err)
	}
	if err := l.Scan(nil); err != nil || l != 0 {
		t.Fatalf("Scan nil: %v %v", l, err)
	}
	if err := l.Scan(3.5); err == nil {
		t.Fatal("Scan float succeeded")
	}
}
