package wire

import "testing"

func TestJSONContentType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json": true, "application/json; charset=utf-8": true, "text/json": true,
		"application/vnd.shop.order+json": true, "APPLICATION/JSON": true,
		"text/plain": false, "application/octet-stream": false, "application/jsonx": false,
		"application/json-seq": false, "": false, "json": false,
	} {
		if got := JSONContentType(ct); got != want {
			t.Errorf("JSONContentType(%q) = %v, want %v", ct, got, want)
		}
	}
}
