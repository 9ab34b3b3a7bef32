package lsn

import (
	"strings"
	"testing"
)

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
	tests := []struct {
		name    string
		src     any
		want    LSN
		wantErr string // a substring of the error; "" for success
	}{
		{"text", "1/2", 1<<32 | 2, ""},
		{"text, zero", "0/0", 0, ""},
		{"text, largest", "FFFFFFFF/FFFFFFFF", ^LSN(0), ""},
		{"bytes", []byte("A/B"), 0xA<<32 | 0xB, ""},
		{"int64", int64(0x16B374D848), 0x16B374D848, ""},
		{"NULL", nil, 0, "NULL"},
		{"empty text", "", 0, "invalid LSN"},
		{"no slash", "16B374D848", 0, "invalid LSN"},
		{"not hex", "1/XYZ", 0, "invalid LSN"},
		{"half too long", "123456789/0", 0, "invalid LSN"},
		{"bad bytes", []byte("1/"), 0, "invalid LSN"},
		{"negative int64", int64(-1), 0, "negative"},
		{"float", 3.5, 0, "unsupported type float64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const before = LSN(0xDEAD)
			l := before
			err := l.Scan(tt.src)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Scan(%#v): %v", tt.src, err)
			case tt.wantErr == "" && l != tt.want:
				t.Fatalf("Scan(%#v) = %v, want %v", tt.src, l, tt.want)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Scan(%#v) error = %v, want one containing %q", tt.src, err, tt.wantErr)
			case tt.wantErr != "" && l != before:
				t.Fatalf("failed Scan(%#v) changed the value to %v", tt.src, l)
			}
		})
	}
}

func TestValueRoundTrip(t *testing.T) {
	for _, l := range []LSN{0, 1, 0x16B374D848, ^LSN(0)} {
		v, err := l.Value()
		if err != nil {
			t.Fatalf("Value(%v): %v", l, err)
		}
		var back LSN
		if err := back.Scan(v); err != nil || back != l {
			t.Fatalf("Scan(Value(%v)) = %v, %v", l, back, err)
		}
	}
}
