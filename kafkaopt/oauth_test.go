package kafkaopt

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// jwt makes an unsigned JWT with the given exp.
func jwt(exp time.Time) string {
	payload, _ := json.Marshal(map[string]any{"sub": "s", "exp": exp.Unix()})
	return base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." +
		base64.RawURLEncoding.EncodeToString(payload) + "."
}

// fakeIdP answers token requests with the scripted responses in turn (the
// last one repeats) and records what it was sent. Handler goroutines only
// record; the test goroutine checks.
type fakeIdP struct {
	mu        sync.Mutex
	responses []string // "status body"
	forms     []string
	auths     []string
}

func (f *fakeIdP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	f.mu.Lock()
	f.forms = append(f.forms, r.PostForm.Encode())
	f.auths = append(f.auths, r.Header.Get("Authorization"))
	resp := f.responses[min(len(f.forms)-1, len(f.responses)-1)]
	f.mu.Unlock()
	var status int
	var body string
	fmt.Sscanf(resp, "%d", &status)
	_, body, _ = strings.Cut(resp, " ")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

func TestTokenSourceCaching(t *testing.T) {
	idp := &fakeIdP{responses: []string{
		`200 {"access_token":"tok-1","token_type":"Bearer","expires_in":100}`,
		`200 {"access_token":"tok-2","token_type":"bearer","expires_in":"100"}`,
	}}
	srv := httptest.NewServer(idp)
	defer srv.Close()
	s := newTokenSource(OAuth{TokenURL: srv.URL, ClientID: "id:x", ClientSecret: "se cret", Scope: "kafka"})
	now := time.Unix(1_000_000, 0)
	s.now = func() time.Time { return now }

	// lifetime 100s: a fifth (20s) before expiry it is fetched again.
	steps := []struct {
		at      time.Duration
		want    string
		fetches int
	}{
		{0, "tok-1", 1},
		{50 * time.Second, "tok-1", 1},
		{79 * time.Second, "tok-1", 1},
		{80 * time.Second, "tok-2", 2},
		{150 * time.Second, "tok-2", 2},
	}
	start := now
	for _, st := range steps {
		now = start.Add(st.at)
		got, err := s.token(t.Context())
		if fetches := len(idp.forms); err != nil || got != st.want || fetches != st.fetches {
			t.Errorf("at +%s: token %q, %v after %d fetches; want %q after %d", st.at, got, err, fetches, st.want, st.fetches)
		}
	}
	if idp.forms[0] != "grant_type=client_credentials&scope=kafka" {
		t.Errorf("form %q", idp.forms[0])
	}
	// RFC 6749 §2.3.1: id and secret form-encoded, then Basic.
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("id%3Ax:se+cret"))
	if idp.auths[0] != want {
		t.Errorf("Authorization %q, want %q", idp.auths[0], want)
	}
}

func TestRefreshMargin(t *testing.T) {
	for _, tt := range []struct{ lifetime, want time.Duration }{
		{0, 0},
		{10 * time.Second, 2 * time.Second},
		{time.Hour, 5 * time.Minute},
		{24 * time.Hour, 5 * time.Minute},
	} {
		if got := refreshMargin(tt.lifetime); got != tt.want {
			t.Errorf("refreshMargin(%s) = %s, want %s", tt.lifetime, got, tt.want)
		}
	}
}

func TestTokenSourceLifetime(t *testing.T) {
	now := time.Unix(2_000_000, 0)
	tests := []struct {
		name string
		body string
		want time.Duration // until the next fetch
	}{
		{"expires_in", `{"access_token":"a","expires_in":3600}`, 55 * time.Minute},
		{"jwt exp without expires_in", fmt.Sprintf(`{"access_token":%q}`, jwt(now.Add(50*time.Second))), 40 * time.Second},
		{"neither: fetched every time", `{"access_token":"opaque"}`, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(&fakeIdP{responses: []string{"200 " + tt.body}})
			defer srv.Close()
			s := newTokenSource(OAuth{TokenURL: srv.URL, ClientID: "id", ClientSecret: "s"})
			s.now = func() time.Time { return now }
			if _, err := s.token(t.Context()); err != nil {
				t.Fatal(err)
			}
			if got := s.cache.refreshAt.Sub(now); got != tt.want {
				t.Errorf("refetch after %s, want %s", got, tt.want)
			}
		})
	}
}

func TestTokenSourceErrors(t *testing.T) {
	const secret = "very-secret-value"
	tests := []struct {
		name string
		resp string
		want []string
	}{
		{"refused", `401 {"error":"invalid_client","error_description":"unknown client"}`,
			[]string{"401", "invalid_client (unknown client)", "check kafka.sasl.oauth.client_id"}},
		{"server error, body not shown", "503 upstream " + secret + " down", []string{"503 Service Unavailable"}},
		// The provider's prose reaches the log: no control characters, no
		// credential it quotes back.
		{"description filtered", `400 {"error":"invalid_request","error_description":"bad\nlevel=ERROR msg=forged client_secret=` + secret + `"}`,
			[]string{"invalid_request (bad level=ERROR msg=forged client_secret=[redacted])"}},
		{"not json", "200 <html>", []string{"not a JSON token response"}},
		{"no token", `200 {"token_type":"Bearer"}`, []string{"no access_token"}},
		{"wrong type", `200 {"access_token":"x","token_type":"mac"}`, []string{`token_type is "mac"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(&fakeIdP{responses: []string{tt.resp}})
			defer srv.Close()
			s := newTokenSource(OAuth{TokenURL: srv.URL + "/token?key=" + secret, ClientID: "id", ClientSecret: secret})
			_, err := s.token(t.Context())
			var te *TokenError
			if !errors.As(err, &te) || !te.Temporary() {
				t.Fatalf("error %v (%T), want a temporary *TokenError", err, err)
			}
			msg := err.Error()
			for _, w := range append(tt.want, "kafka.sasl.oauth.token_url "+srv.URL+"/token") {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
			if strings.Contains(msg, secret) {
				t.Errorf("error shows the secret: %q", msg)
			}
			if SecurityFailure(err) == "" {
				t.Errorf("SecurityFailure does not classify %q", msg)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close()
		_, err := newTokenSource(OAuth{TokenURL: url, ClientID: "id", ClientSecret: "s"}).token(t.Context())
		if err == nil || !strings.Contains(err.Error(), "request failed") || strings.Count(err.Error(), url) != 1 {
			t.Errorf("error %v, want one mention of %s and the reason", err, url)
		}
	})
}

func TestTokenSourceSecretFileRotates(t *testing.T) {
	idp := &fakeIdP{responses: []string{`200 {"access_token":"a"}`}} // no lifetime: fetched every time
	srv := httptest.NewServer(idp)
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "secret")
	s := newTokenSource(OAuth{TokenURL: srv.URL, ClientID: "id", ClientSecretFile: file})
	for _, secret := range []string{"first", "second"} {
		if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := s.token(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("id:second"))
	if len(idp.auths) != 2 || idp.auths[1] != want {
		t.Errorf("authorizations %q, want the second with the rotated secret", idp.auths)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	_, err := s.token(t.Context())
	if err == nil || !strings.Contains(err.Error(), "kafka.sasl.oauth.client_secret_file "+file+": file does not exist") {
		t.Errorf("missing secret file: %v", err)
	}
}

func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	s := newTokenSource(OAuth{TokenFile: file})
	now := time.Unix(3_000_000, 0)
	s.now = func() time.Time { return now }
	write := func(tok string) {
		if err := os.WriteFile(file, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	fresh, later := jwt(now.Add(time.Minute)), jwt(now.Add(time.Hour))
	for _, tt := range []struct {
		content, want, wantErr string
	}{
		{fresh + "\n", fresh, ""},
		{later, later, ""}, // re-read at every call
		{"opaque-token", "opaque-token", ""},
		{jwt(now.Add(-time.Second)), "", "the token expired at 1970-02-04T17:19:59Z (is the process that renews the file running?)"},
		{"", "", "is empty"},
	} {
		write(tt.content)
		got, err := s.token(t.Context())
		switch {
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("file %q: token %q, %v; want %q", tt.content, got, err, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), "kafka.sasl.oauth.token_file "+file+": "+tt.wantErr)):
			t.Errorf("file %q: error %v, want %q", tt.content, err, tt.wantErr)
		}
	}
}

func TestJWTExpiry(t *testing.T) {
	exp := time.Unix(1_700_000_000, 0)
	for _, tt := range []struct {
		tok  string
		ok   bool
		want time.Time
	}{
		{jwt(exp), true, exp},
		{"a.b", false, time.Time{}},
		{"a.!!!.c", false, time.Time{}},
		{"a." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"x"}`)) + ".c", false, time.Time{}},
		{"opaque", false, time.Time{}},
	} {
		got, ok := jwtExpiry(tt.tok)
		if ok != tt.ok || !got.Equal(tt.want) {
			t.Errorf("jwtExpiry(%q) = %v, %v; want %v, %v", tt.tok, got, ok, tt.want, tt.ok)
		}
	}
}

// TestOAuthMechanismPayload: the mechanism sends the source's token and
// the extensions in the RFC 7628 initial response.
func TestOAuthMechanismPayload(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("tok-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := SASLMechanism(SASL{Mechanism: MechanismOAuthBearer,
		OAuth: OAuth{TokenFile: file, Extensions: map[string]string{"logicalCluster": "lkc-1"}}})
	if err != nil {
		t.Fatal(err)
	}
	_, first, err := m.Authenticate(context.Background(), "broker:9092")
	if err != nil {
		t.Fatal(err)
	}
	if want := "n,,\x01auth=Bearer tok-from-file\x01logicalCluster=lkc-1\x01\x01"; string(first) != want {
		t.Errorf("initial response %q, want %q", first, want)
	}
	if _, err := SASLMechanism(SASL{Mechanism: MechanismOAuthBearer}); err == nil {
		t.Error("OAUTHBEARER without a token source accepted")
	}
}
