package kafkaopt

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL mechanisms understood by SecurityOpts.
const (
	MechanismPlain       = "PLAIN"
	MechanismScramSHA256 = "SCRAM-SHA-256"
	MechanismScramSHA512 = "SCRAM-SHA-512"
	MechanismOAuthBearer = "OAUTHBEARER"
	MechanismAWSMSKIAM   = "AWS_MSK_IAM"
)

// Mechanisms lists the SASL mechanisms SASLMechanism accepts.
func Mechanisms() []string {
	return []string{MechanismPlain, MechanismScramSHA256, MechanismScramSHA512, MechanismOAuthBearer, MechanismAWSMSKIAM}
}

// Security is how the producer connects to the brokers: TLS, SASL, both or
// neither (the zero value: plaintext, no authentication).
type Security struct {
	TLS  *TLS  // nil: no TLS
	SASL *SASL // nil: no SASL
}

// TLS configures encrypted broker connections. The files are read once, by
// SecurityOpts.
type TLS struct {
	// CAFile is a PEM bundle of the authorities that sign the brokers'
	// certificates; "" uses the system roots.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and its key, for
	// brokers that require client authentication; both or neither.
	CertFile, KeyFile string
	// ServerName is verified instead of each broker's host when set.
	ServerName string
	// InsecureSkipVerify accepts any broker certificate (tests only).
	InsecureSkipVerify bool
}

// SASL configures broker authentication.
type SASL struct {
	Mechanism string // one of Mechanisms
	Username  string // PLAIN and SCRAM
	Password  Secret // PLAIN and SCRAM
	OAuth     OAuth  // OAUTHBEARER
}

// String shows the mechanism and user, never the password.
func (s SASL) String() string {
	return fmt.Sprintf("{mechanism: %s, username: %s, password: %s}", s.Mechanism, s.Username, s.Password)
}

// Secret is a password. However it is printed (every fmt verb, %#v
// included; encoding/json, YAML and other TextMarshaler users; slog) it
// shows as xxxxx, or as nothing when empty. string(s) is the password, for
// the code that uses it. The configuration and the sink share this type.
type Secret string

// Redacted is what a Secret prints as.
const Redacted = "xxxxx"

func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return Redacted
}

// Format applies the verb to the redacted text.
func (s Secret) Format(f fmt.State, verb rune) { fmt.Fprintf(f, fmt.FormatString(f, verb), s.String()) }

func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// SecurityOpts returns the client options for sec: kgo.DialTLSConfig for
// TLS and kgo.SASL for SASL. Files are read now; errors name the file and
// never include a secret.
func SecurityOpts(sec Security) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if sec.TLS != nil {
		cfg, err := TLSConfig(*sec.TLS)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	if sec.SASL != nil {
		m, err := SASLMechanism(*sec.SASL)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// TLSConfig builds the client TLS configuration: TLS 1.2 or newer, the CA
// bundle as the only roots when given, and the client certificate when
// given. franz-go clones it per connection and fills in ServerName from the
// broker address when it is empty. Its errors are CheckTLS's problems.
func TLSConfig(t TLS) (*tls.Config, error) {
	cfg, problems := loadTLS(t)
	if len(problems) > 0 {
		errs := make([]error, len(problems))
		for i, p := range problems {
			errs[i] = p
		}
		return nil, errors.Join(errs...)
	}
	return cfg, nil
}

// TLSProblem is a TLS setting that cannot work. Key is the configuration
// key that holds it and Value its value (a file or a server name; "" when it
// is missing); no field holds key material.
type TLSProblem struct {
	Key, Value, Problem, Fix string
}

func (p TLSProblem) Error() string {
	if p.Value == "" {
		return p.Key + ": " + p.Problem
	}
	return p.Key + " " + p.Value + ": " + p.Problem
}

// CheckTLS reports every problem of t, reading the files as TLSConfig does,
// so that the configuration can reject them before start: a file that
// cannot be used, a certificate without its key or the reverse, a server
// name that is not a host name.
func CheckTLS(t TLS) []TLSProblem {
	_, problems := loadTLS(t)
	return problems
}

func loadTLS(t TLS) (*tls.Config, []TLSProblem) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // opt-in, warned about at start
	}
	var problems []TLSProblem
	bad := func(key, value, problem, fix string) {
		problems = append(problems, TLSProblem{key, value, problem, fix})
	}
	if t.CAFile != "" {
		cfg.RootCAs = x509.NewCertPool()
		b, err := readFile(t.CAFile, 0)
		if err == nil && !cfg.RootCAs.AppendCertsFromPEM(b) {
			err = errors.New("holds no PEM certificate")
		}
		if err != nil {
			bad("kafka.tls.ca_file", t.CAFile, err.Error(),
				"give a readable PEM file with the certificate of the authority that signs the brokers' certificates")
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		bad("kafka.tls.key_file", "", "required when kafka.tls.cert_file is set",
			"set it to the PEM private key of the client certificate, or remove kafka.tls.cert_file")
	case t.KeyFile != "" && t.CertFile == "":
		bad("kafka.tls.cert_file", "", "required when kafka.tls.key_file is set",
			"set it to the PEM client certificate of that key, or remove kafka.tls.key_file")
	case t.CertFile != "":
		cert, certErr := readPEM(t.CertFile, "CERTIFICATE", "holds no PEM certificate")
		if certErr != nil {
			bad("kafka.tls.cert_file", t.CertFile, certErr.Error(), "give a readable PEM file with the client certificate (and its chain)")
		}
		key, keyErr := readPEM(t.KeyFile, "PRIVATE KEY",
			"holds no PEM private key (PKCS#1, PKCS#8 or EC; encrypted keys are not supported)")
		if keyErr != nil {
			bad("kafka.tls.key_file", t.KeyFile, keyErr.Error(), "give a readable PEM file with the client certificate's unencrypted private key")
		}
		if certErr == nil && keyErr == nil {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				// The error names the problem (key mismatch, bad key), never
				// the key's content.
				bad("kafka.tls.key_file", t.KeyFile, "does not go with kafka.tls.cert_file: "+strings.TrimPrefix(err.Error(), "tls: "),
					"give the private key that belongs to the certificate in kafka.tls.cert_file")
			} else {
				cfg.Certificates = []tls.Certificate{pair}
			}
		}
	}
	if t.ServerName != "" && net.ParseIP(t.ServerName) == nil && strings.ContainsAny(t.ServerName, " \t/:") {
		bad("kafka.tls.server_name", t.ServerName, "not a host name",
			"give the DNS name (or IP address) the brokers' certificates are issued for, without port")
	}
	return cfg, problems
}

// readPEM reads a file that must hold a PEM block whose type ends with
// suffix (PRIVATE KEY matches RSA, EC and PKCS#8 keys, not encrypted ones);
// noBlock is the error when it does not.
func readPEM(path, suffix, noBlock string) ([]byte, error) {
	b, err := readFile(path, 0)
	for rest := b; err == nil; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			return nil, errors.New(noBlock)
		}
		if strings.HasSuffix(blk.Type, suffix) && !strings.Contains(blk.Type, "ENCRYPTED") {
			return b, nil
		}
	}
	return nil, err
}

// MaxSecretSize bounds a password file or a password command's output:
// anything larger is a mistake (a key or a directory listing), not a password.
const MaxSecretSize = 64 << 10

// ReadSecretFile reads a password file: the whole content minus trailing
// newlines (\n or \r\n, as editors and `echo` leave them). Its errors are
// short reasons that name neither the file nor its content.
func ReadSecretFile(path string) (Secret, error) {
	b, err := readFile(path, MaxSecretSize)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", errors.New("is empty")
	}
	return Secret(s), nil
}

// readFile reads a password, certificate or key file no larger than maxSize
// (0: any size), with short reasons that leave out the path: the messages
// built from them show it once.
func readFile(path string, maxSize int64) ([]byte, error) {
	fi, err := os.Stat(path)
	if err == nil && !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	if err == nil && maxSize > 0 && fi.Size() > maxSize {
		return nil, fmt.Errorf("larger than %d bytes, not a password", maxSize)
	}
	var b []byte
	if err == nil {
		b, err = os.ReadFile(path)
	}
	var pe *fs.PathError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, errors.New("file does not exist")
	case errors.Is(err, fs.ErrPermission):
		return nil, errors.New("file is not readable by this process (permission denied)")
	case errors.As(err, &pe):
		return nil, pe.Err
	}
	return b, err
}

// SASLMechanism returns the franz-go mechanism for s.
func SASLMechanism(s SASL) (sasl.Mechanism, error) {
	switch s.Mechanism {
	case MechanismOAuthBearer:
		if (s.OAuth.TokenURL == "") == (s.OAuth.TokenFile == "") {
			return nil, errors.New("kafka.sasl.oauth: set exactly one of token_url and token_file with OAUTHBEARER")
		}
		return oauthMechanism(s.OAuth), nil
	case MechanismAWSMSKIAM:
		return awsMechanism(os.Getenv), nil
	case MechanismPlain, MechanismScramSHA256, MechanismScramSHA512:
	default:
		return nil, fmt.Errorf("kafka.sasl.mechanism %q: use one of %s", s.Mechanism, strings.Join(Mechanisms(), ", "))
	}
	if s.Username == "" {
		return nil, errors.New("kafka.sasl.username: required with a SASL mechanism")
	}
	if s.Password == "" {
		return nil, errors.New("kafka.sasl.password: required with a SASL mechanism")
	}
	pw := string(s.Password)
	if s.Mechanism == MechanismPlain {
		return plain.Auth{User: s.Username, Pass: pw}.AsMechanism(), nil
	}
	if s.Mechanism == MechanismScramSHA256 {
		return scram.Auth{User: s.Username, Pass: pw}.AsSha256Mechanism(), nil
	}
	return scram.Auth{User: s.Username, Pass: pw}.AsSha512Mechanism(), nil
}

// SecurityFailureLog returns a client option that logs, at error level,
// connection attempts that fail for TLS or SASL reasons: an untrusted or
// misnamed broker certificate, a client certificate the broker refuses,
// wrong credentials, TLS against a plaintext port. The client retries
// those like any connection failure (credentials can be fixed on the broker
// side while the connector waits), so without this nothing would say why
// records do not get out. The first failure per broker and reason is logged
// at once, repeats at most every interval (with a count). Messages carry
// the broker address and the error, which never holds a password.
func SecurityFailureLog(log *slog.Logger, interval time.Duration) kgo.Opt {
	if log == nil {
		log = slog.Default()
	}
	return kgo.WithHooks(&securityFailureHook{log: log, interval: interval, last: map[string]*failureSeen{}})
}

type securityFailureHook struct {
	log      *slog.Logger
	interval time.Duration
	mu       sync.Mutex
	last     map[string]*failureSeen // broker + reason
}

type failureSeen struct {
	at         time.Time
	suppressed int
}

var _ kgo.HookBrokerConnect = (*securityFailureHook)(nil)

// OnBrokerConnect implements kgo.HookBrokerConnect; err includes the TLS
// handshake and the SASL exchange.
func (h *securityFailureHook) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil {
		return
	}
	reason := SecurityFailure(err)
	if reason == "" {
		return
	}
	broker := net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))
	key := broker + "\x00" + reason
	now := time.Now()
	h.mu.Lock()
	seen := h.last[key]
	if seen != nil && now.Sub(seen.at) < h.interval {
		seen.suppressed++
		h.mu.Unlock()
		return
	}
	suppressed := 0
	if seen != nil {
		suppressed = seen.suppressed
	}
	h.last[key] = &failureSeen{at: now}
	h.mu.Unlock()
	args := []any{"broker", broker, "err", err.Error()}
	if suppressed > 0 {
		args = append(args, "repeated", suppressed)
	}
	h.log.Error("kafka: "+reason+"; retrying", args...)
}

// SecurityFailure says what an error from connecting to a broker means when
// it is a TLS or SASL problem, naming the keys to look at; "" otherwise. A
// connection closed without a word is not classified: a broker shutting
// down does that too, and a misleading error is worse than none.
func SecurityFailure(err error) string {
	var (
		hostname  x509.HostnameError
		unknownCA x509.UnknownAuthorityError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		alert     tls.AlertError
		header    tls.RecordHeaderError
		token     *TokenError
	)
	switch {
	case errors.As(err, &token):
		return "no " + token.What + " (check " + token.Check + ")"
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.IllegalSaslState):
		return "SASL authentication failed (check kafka.sasl.username and the password; with OAUTHBEARER the token, with AWS_MSK_IAM the AWS credentials)"
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return "the broker does not offer this SASL mechanism (check kafka.sasl.mechanism)"
	case errors.As(err, &hostname):
		return "the broker's certificate is not valid for its address (check kafka.tls.server_name)"
	case errors.As(err, &unknownCA), errors.As(err, &invalid), errors.As(err, &verify):
		return "the broker's certificate is not trusted (check kafka.tls.ca_file)"
	case errors.As(err, &alert), strings.Contains(err.Error(), "remote error: tls: "):
		// Over TCP a TLS alert from the broker is a *net.OpError around an
		// unexported type; its text is all there is.
		return "the broker refused the TLS handshake (client certificate missing or not trusted? check kafka.tls.cert_file)"
	case errors.As(err, &header):
		return "the broker does not speak TLS on this port (check kafka.tls.enabled and kafka.brokers)"
	case strings.Contains(err.Error(), "tls alert record"):
		// franz-go's reading of a TLS alert answering a plaintext request.
		return "the broker expects TLS on this port (check kafka.tls.enabled)"
	}
	return ""
}

// RetryEOF makes the client retry a connection the broker closes before
// answering. franz-go takes that for a TLS or SASL mismatch and fails the
// records, but a restarting broker does it too, and a running connector must
// wait for it; a real mismatch is still reported by SecurityFailureLog.
// check, which must answer, goes without it.
func RetryEOF() kgo.Opt { return kgo.AlwaysRetryEOF() }
