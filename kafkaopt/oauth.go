package kafkaopt

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
)

// OAuth is where SASL/OAUTHBEARER tokens come from: a token endpoint with
// the client-credentials grant (TokenURL), or a file another process keeps
// fresh (TokenFile, such as a Kubernetes projected service account token).
// Exactly one of TokenURL and TokenFile is set.
type OAuth struct {
	TokenURL     string
	ClientID     string
	ClientSecret Secret
	// ClientSecretFile holds the client secret instead of ClientSecret; it
	// is read at every token request, so a rotated secret is picked up.
	ClientSecretFile string
	Scope            string            // "" sends no scope
	Extensions       map[string]string // SASL extensions (KIP-342), such as logicalCluster
	TokenFile        string
	// HTTPClient requests tokens; nil uses one with a 30s timeout.
	HTTPClient *http.Client
}

// TokenError is a credential that could not be obtained: a token endpoint
// or STS is down or refuses the client, or a token file is missing or
// expired. No field holds a secret. It is temporary: the client retries the
// connection, so a service that comes back, or a refreshed file, lets the
// connector continue.
type TokenError struct {
	What    string // OAUTHBEARER token, AWS credentials
	Source  string // the key and the URL or file: kafka.sasl.oauth.token_url https://…
	Problem string
	Check   string // what to check, for SecurityFailure
}

func (e *TokenError) Error() string { return e.What + " from " + e.Source + ": " + e.Problem }

// oauthError is a TokenError of the OAUTHBEARER token source.
func oauthError(source, problem string) *TokenError {
	return &TokenError{What: "OAUTHBEARER token", Source: source, Problem: problem,
		Check: "the kafka.sasl.oauth keys and the token service"}
}

// Temporary makes franz-go retry the connection (kgo's isRetryableBrokerErr).
func (*TokenError) Temporary() bool { return true }

// oauthMechanism returns OAUTHBEARER with a token source asked at every
// connection and reauthentication, which franz-go does before the broker's
// session lifetime (at most the token's) runs out.
func oauthMechanism(o OAuth) sasl.Mechanism {
	src := newTokenSource(o)
	return oauth.Oauth(func(ctx context.Context) (oauth.Auth, error) {
		tok, err := src.token(ctx)
		if err != nil {
			return oauth.Auth{}, err
		}
		return oauth.Auth{Token: tok, Extensions: o.Extensions}, nil
	})
}

// tokenSource caches a client-credentials token until shortly before it
// expires; a token file is read at every call, which is what a projected
// token (replaced by its writer before it expires) needs.
type tokenSource struct {
	o      OAuth
	client *http.Client
	now    func() time.Time
	cache  expiring[string]
}

func newTokenSource(o OAuth) *tokenSource {
	c := o.HTTPClient
	if c == nil {
		c = &http.Client{Timeout: 30 * time.Second}
	}
	return &tokenSource{o: o, client: c, now: time.Now}
}

func (s *tokenSource) token(ctx context.Context) (string, error) {
	if s.o.TokenFile != "" {
		return s.fileToken()
	}
	return s.cache.get(s.now(), func() (string, time.Duration, error) { return s.fetch(ctx) })
}

// expiring keeps a credential until refreshMargin before it expires. get
// holds its lock while fetching: concurrent connections wait for one
// request instead of each making one.
type expiring[T any] struct {
	mu        sync.Mutex
	value     T
	set       bool
	refreshAt time.Time
}

// get returns the kept value, or fetches a new one (with its lifetime; 0
// keeps nothing) when it is due at now.
func (e *expiring[T]) get(now time.Time, fetch func() (T, time.Duration, error)) (T, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.set && now.Before(e.refreshAt) {
		return e.value, nil
	}
	v, lifetime, err := fetch()
	if err != nil {
		var zero T
		return zero, err
	}
	e.value, e.set, e.refreshAt = v, true, now.Add(lifetime-refreshMargin(lifetime))
	return v, nil
}

// refreshMargin is how long before its expiry a token is replaced: a fifth
// of its lifetime, at most five minutes, so that a connection opened just
// before the refresh still authenticates with time to spare.
func refreshMargin(lifetime time.Duration) time.Duration {
	return min(lifetime/5, 5*time.Minute)
}

func (s *tokenSource) fileToken() (string, error) {
	src := "kafka.sasl.oauth.token_file " + s.o.TokenFile
	b, err := ReadSecretFile(s.o.TokenFile)
	if err != nil {
		return "", oauthError(src, err.Error())
	}
	tok := strings.TrimSpace(string(b))
	if exp, ok := jwtExpiry(tok); ok && !s.now().Before(exp) {
		return "", oauthError(src, "the token expired at "+exp.UTC().Format(time.RFC3339)+
			" (is the process that renews the file running?)")
	}
	return tok, nil
}

// maxTokenResponse bounds a token endpoint's answer.
const maxTokenResponse = 1 << 20

// fetch requests a token with the client-credentials grant (RFC 6749
// §4.4), authenticating the client with HTTP Basic (§2.3.1). lifetime is
// expires_in, else the JWT's exp, else 0 (not cached).
func (s *tokenSource) fetch(ctx context.Context) (tok string, lifetime time.Duration, err error) {
	src := "kafka.sasl.oauth.token_url " + redactURL(s.o.TokenURL)
	fail := func(format string, args ...any) (string, time.Duration, error) {
		return "", 0, oauthError(src, fmt.Sprintf(format, args...))
	}
	secret := string(s.o.ClientSecret)
	if s.o.ClientSecretFile != "" {
		b, err := ReadSecretFile(s.o.ClientSecretFile)
		if err != nil {
			return fail("kafka.sasl.oauth.client_secret_file %s: %v", s.o.ClientSecretFile, err)
		}
		secret = string(b)
	}
	form := url.Values{"grant_type": {"client_credentials"}}
	if s.o.Scope != "" {
		form.Set("scope", s.o.Scope)
	}
	status, body, err := postForm(ctx, s.client, s.o.TokenURL, form, func(req *http.Request) {
		req.Header.Set("Accept", "application/json")
		req.SetBasicAuth(url.QueryEscape(s.o.ClientID), url.QueryEscape(secret))
	})
	if err != nil {
		return fail("%v", err)
	}
	var r struct {
		AccessToken string          `json:"access_token"`
		TokenType   string          `json:"token_type"`
		ExpiresIn   json.RawMessage `json:"expires_in"`
		Error       string          `json:"error"`
		Description string          `json:"error_description"`
	}
	jsonErr := json.Unmarshal(body, &r)
	if status.StatusCode != http.StatusOK {
		// The error fields are codes and prose meant for the client (RFC
		// 6749 §5.2); the rest of the body is not shown.
		problem := "answered " + status.Status
		if r.Error != "" {
			problem += ": " + LogText(r.Error)
			if r.Description != "" {
				problem += " (" + LogText(r.Description) + ")"
			}
		}
		if status.StatusCode == http.StatusUnauthorized || r.Error == "invalid_client" {
			problem += "; check kafka.sasl.oauth.client_id and the client secret"
		}
		return fail("%s", problem)
	}
	switch {
	case jsonErr != nil:
		return fail("the answer is not a JSON token response")
	case r.AccessToken == "":
		return fail("the answer has no access_token")
	case r.TokenType != "" && !strings.EqualFold(r.TokenType, "bearer"):
		return fail("token_type is %q, not Bearer", r.TokenType)
	}
	if secs, err := strconv.ParseFloat(strings.Trim(string(r.ExpiresIn), `"`), 64); err == nil && secs > 0 {
		lifetime = time.Duration(secs * float64(time.Second))
	} else if exp, ok := jwtExpiry(r.AccessToken); ok {
		lifetime = max(exp.Sub(s.now()), 0)
	}
	return r.AccessToken, lifetime, nil
}

// postForm POSTs form to endpoint (decorate adds headers) and returns the
// response, whose body is closed, and up to maxTokenResponse bytes of that
// body. Its errors leave out the URL, which the callers name once.
func postForm(ctx context.Context, c *http.Client, endpoint string, form url.Values, decorate func(*http.Request)) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if decorate != nil {
		decorate(req)
	}
	resp, err := c.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, nil, fmt.Errorf("request failed: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenResponse))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the answer: %w", err)
	}
	return resp, body, nil
}

// jwtExpiry reads the exp claim of a JWT without verifying it (the broker
// does that): enough to tell when a token is no longer worth sending.
func jwtExpiry(tok string) (time.Time, bool) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *float64 `json:"exp"`
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	return time.Unix(0, int64(*claims.Exp*float64(time.Second))), true
}

// redactURL drops user info, query and fragment from a token URL before it
// is shown: any of them could carry a credential.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User, u.RawQuery, u.Fragment, u.RawFragment = nil, "", "", ""
	return u.String()
}
