package testenv

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// KafkaOAuthBearer adds a SASL_PLAINTEXT listener named OAUTH that accepts
// OAUTHBEARER with Kafka's default, unsecured JWT validator: any token with
// the header {"alg":"none"}, a sub claim and an exp claim in the future is
// accepted (UnsecuredJWT makes one). Inter-broker traffic stays on
// PLAINTEXT.
type KafkaOAuthBearer struct {
	// MaxReauth is the listener's connections.max.reauth.ms: with it the
	// broker ends each session when its token expires (or after MaxReauth,
	// whichever comes first) unless the client reauthenticates (KIP-368).
	// 0 leaves sessions unlimited, whatever the token's exp.
	MaxReauth time.Duration
}

// oauthProperties are the server.properties entries of the OAUTH listener;
// writeConfig appends the listener itself to the listener lists.
func (k *Kafka) oauthProperties() map[string]string {
	const l = "listener.name.oauth."
	props := map[string]string{
		l + "sasl.enabled.mechanisms": "OAUTHBEARER",
		// The broker's own login, which the listener needs even though the
		// broker never connects through it.
		l + "oauthbearer.sasl.jaas.config": `org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="broker";`,
	}
	if k.oauth.MaxReauth > 0 {
		props[l+"oauthbearer.connections.max.reauth.ms"] = strconv.FormatInt(k.oauth.MaxReauth.Milliseconds(), 10)
	}
	return props
}

// OAuthBrokers returns the bootstrap addresses of the OAUTH listener
// (SASL_PLAINTEXT, OAUTHBEARER with unsecured JWTs), or nil when the broker
// was started without OAuthBearer or is external.
func (k *Kafka) OAuthBrokers() []string {
	if k.external != nil || k.oauth == nil {
		return nil
	}
	return []string{k.oauthAddr()}
}

func (k *Kafka) oauthAddr() string { return "127.0.0.1:" + strconv.Itoa(k.oauthPort) }

// UnsecuredJWT returns a token the OAUTH listener accepts: alg none, the
// subject, issued now and expiring after ttl (a negative ttl makes an
// expired one).
func UnsecuredJWT(sub string, ttl time.Duration) string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	now := time.Now()
	return fmt.Sprintf("%s.%s.", enc(map[string]string{"alg": "none"}),
		enc(map[string]any{"sub": sub, "iat": now.Unix(), "exp": now.Add(ttl).Unix()}))
}
