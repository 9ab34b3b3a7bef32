package config

import (
	"maps"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
)

// KafkaOAuth is where OAUTHBEARER tokens come from (docs/security.md):
// the client-credentials grant against TokenURL, or TokenFile.
type KafkaOAuth struct {
	TokenURL         string            `koanf:"token_url"`
	ClientID         string            `koanf:"client_id"`
	ClientSecret     kafkaopt.Secret   `koanf:"client_secret"`
	ClientSecretFile string            `koanf:"client_secret_file"` // read at every token request
	Scope            string            `koanf:"scope"`
	Extensions       map[string]string `koanf:"extensions"`
	TokenFile        string            `koanf:"token_file"` // read at every connection
}

func (o KafkaOAuth) set() bool {
	return o.TokenURL != "" || o.ClientID != "" || o.ClientSecret != "" || o.ClientSecretFile != "" ||
		o.Scope != "" || len(o.Extensions) > 0 || o.TokenFile != ""
}

// Sink returns the token source settings for the sink.
func (o KafkaOAuth) Sink() kafkaopt.OAuth {
	return kafkaopt.OAuth{TokenURL: o.TokenURL, ClientID: o.ClientID, ClientSecret: o.ClientSecret,
		ClientSecretFile: o.ClientSecretFile, Scope: o.Scope, Extensions: o.Extensions, TokenFile: o.TokenFile}
}

// RFC 7628 §3.1: key = 1*(ALPHA); "auth" is the token itself.
var saslExtensionKeyRE = regexp.MustCompile(`^[A-Za-z]+$`)

// kafkaTokenSASL checks the mechanisms that take no user name and password
// (OAUTHBEARER, AWS_MSK_IAM) and reports whether s uses one; for the
// others it only reports kafka.sasl.oauth keys that would be ignored.
func (v *validator) kafkaTokenSASL(s KafkaSASL) bool {
	o := s.OAuth
	switch s.Mechanism {
	case kafkaopt.MechanismOAuthBearer, kafkaopt.MechanismAWSMSKIAM:
	default:
		if o.set() {
			v.add("kafka.sasl.oauth", "", "set while kafka.sasl.mechanism is not "+kafkaopt.MechanismOAuthBearer+", so it would be ignored",
				"set kafka.sasl.mechanism: "+kafkaopt.MechanismOAuthBearer+", or remove the kafka.sasl.oauth keys")
		}
		return false
	}
	for key, set := range map[string]bool{"kafka.sasl.username": s.Username != "", "kafka.sasl.password": s.Password != "",
		"kafka.sasl.password_file": s.PasswordFile != ""} {
		if set {
			v.add(key, "", "not used with kafka.sasl.mechanism "+s.Mechanism, "remove it")
		}
	}
	if s.Mechanism == kafkaopt.MechanismAWSMSKIAM {
		if o.set() {
			v.add("kafka.sasl.oauth", "", "not used with kafka.sasl.mechanism "+kafkaopt.MechanismAWSMSKIAM, "remove the kafka.sasl.oauth keys")
		}
		if p := kafkaopt.AWSCredentialsProblem(os.Getenv); p != "" {
			v.add("kafka.sasl.mechanism", s.Mechanism, p,
				"export them (with "+kafkaopt.EnvAWSSessionToken+" for temporary keys) in the connector's environment")
		}
		return true
	}
	switch {
	case o.TokenURL == "" && o.TokenFile == "":
		v.add("kafka.sasl.oauth.token_url", "", "required with kafka.sasl.mechanism OAUTHBEARER (or kafka.sasl.oauth.token_file)",
			"set the token endpoint of your identity provider, or a file that holds a current token")
	case o.TokenURL != "" && o.TokenFile != "":
		v.add("kafka.sasl.oauth.token_file", o.TokenFile, "set together with kafka.sasl.oauth.token_url",
			"keep one: a token endpoint (client credentials) or a token file")
	case o.TokenFile != "":
		if _, err := kafkaopt.ReadSecretFile(o.TokenFile); err != nil {
			v.add("kafka.sasl.oauth.token_file", o.TokenFile, err.Error(), "give a file readable by this process that holds the token")
		}
		if o.ClientID != "" || o.ClientSecret != "" || o.ClientSecretFile != "" || o.Scope != "" {
			v.add("kafka.sasl.oauth.token_file", o.TokenFile, "set together with client credentials keys (client_id, client_secret, client_secret_file, scope)",
				"remove those keys: they are only used with kafka.sasl.oauth.token_url")
		}
	default:
		v.tokenURL(o)
	}
	for _, k := range slices.Sorted(maps.Keys(o.Extensions)) {
		if !saslExtensionKeyRE.MatchString(k) || k == "auth" {
			v.add("kafka.sasl.oauth.extensions."+k, "", "not a SASL extension name", `use letters only, and not "auth"`)
		}
		if strings.ContainsRune(o.Extensions[k], '\x01') {
			v.add("kafka.sasl.oauth.extensions."+k, "", "contains the byte 0x01, the SASL separator", "remove it")
		}
	}
	return true
}

// tokenURL checks the client-credentials settings.
func (v *validator) tokenURL(o KafkaOAuth) {
	u, err := url.Parse(o.TokenURL)
	switch {
	case err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http"):
		v.add("kafka.sasl.oauth.token_url", "", "not an http(s) URL", "give the token endpoint, such as https://idp.example.com/oauth2/token")
	case u.User != nil:
		v.add("kafka.sasl.oauth.token_url", "", "has user info", "remove it: the client authenticates with client_id and the client secret")
	case u.Scheme == "http" && !isLoopback(u.Hostname()):
		v.add("kafka.sasl.oauth.token_url", o.TokenURL, "plain http would send the client secret in clear text",
			"use https (http is accepted for loopback addresses only)")
	}
	if o.ClientID == "" {
		v.add("kafka.sasl.oauth.client_id", "", "required with kafka.sasl.oauth.token_url",
			"set it in the config file or "+envName("kafka.sasl.oauth.client_id"))
	}
	v.secretOrFile("kafka.sasl.oauth.client_secret", o.ClientSecret != "", o.ClientSecretFile,
		"required with kafka.sasl.oauth.token_url", "client secret")
}

// secretOrFile checks a secret given in key or in the file of key_file:
// exactly one of them, and a file that can be read. No message shows the
// secret; what names it in the fix.
func (v *validator) secretOrFile(key string, inline bool, file, required, what string) {
	fileKey := key + "_file"
	switch {
	case inline && file != "":
		v.add(key, "", "set together with "+fileKey,
			"keep one: remove "+key+" (and "+envName(key)+") or "+fileKey)
	case !inline && file == "":
		v.add(key, "", required, "set "+fileKey+" to a file holding it, or "+envName(key))
	case file != "":
		if _, err := kafkaopt.ReadSecretFile(file); err != nil {
			v.add(fileKey, file, err.Error(), "give a file readable by this process that holds only the "+what)
		}
	}
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
