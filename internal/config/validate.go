package config

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Limits checked by Validate. They are here, in one place, with the reason
// for each.
const (
	// Standby status updates double as keepalives: the interval must be far
	// below wal_sender_timeout (60s by default), and a tiny one only burns CPU.
	minStatusInterval = 10 * time.Millisecond
	maxStatusInterval = 30 * time.Second

	// Below this the stream hands rows over one or two at a time.
	minQueueBytes = 1 << 20

	// Below a second a busy server can miss a ping; above an hour a dead
	// connection goes unnoticed for too long.
	minReceiveTimeout = time.Second
	maxReceiveTimeout = time.Hour

	minReconnectBackoffMax = 100 * time.Millisecond
	maxReconnectBackoffMax = 10 * time.Minute

	// franz-go rejects a linger above one minute.
	maxLinger = time.Minute

	// franz-go's bounds for a request timeout and its overhead are
	// [100ms, 15m]; keep request_timeout inside them whichever it maps to.
	minRequestTimeout = 100 * time.Millisecond
	maxRequestTimeout = 15 * time.Minute

	// A record larger than max_buffered_bytes can never be produced and goes
	// to the DLQ. Below 1 MiB (the broker's default message.max.bytes) records
	// the broker would accept would be dead-lettered.
	minBufferedBytes = 1 << 20

	// Kafka's CreateTopics fields are int32 and int16; a topic rarely
	// needs more than a few thousand partitions.
	maxTopicPartitions   = 1 << 20
	maxReplicationFactor = 1<<15 - 1

	maxClientIDLen   = 256 // franz-go's limit
	maxTopicLen      = 249 // Kafka's limit
	maxIdentifierLen = 63  // PostgreSQL NAMEDATALEN-1
)

var (
	compressions = []string{"none", "gzip", "snappy", "lz4", "zstd"}
	logLevels    = []string{"debug", "info", "warn", "error"}
	logFormats   = []string{"text", "json"}

	// The fixed record headers; a header column may not reuse these names.
	reservedHeaders = []string{"id", "event_type", "aggregate_type"}

	slotRE        = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	publicationRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	identifierRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*$`)
	topicCharsRE  = regexp.MustCompile(`^[a-zA-Z0-9._-]*$`)
)

// FieldError is one problem with one key.
type FieldError struct {
	Key     string // dotted key (kafka.brokers, kafka.brokers[1]) or, for an unknown variable, its name
	Value   string // the offending value as given, DSN redacted; "" if none
	Problem string // what is wrong
	Fix     string // what to do about it; may be ""
}

// Error prints `key = "value": problem; fix`, leaving out what is empty.
func (e FieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.Key)
	if e.Value != "" {
		b.WriteString(" = ")
		b.WriteString(strconv.Quote(e.Value))
	}
	b.WriteString(": ")
	b.WriteString(e.Problem)
	if e.Fix != "" {
		b.WriteString("; ")
		b.WriteString(e.Fix)
	}
	return b.String()
}

// ValidationError lists every problem found in a configuration. It matches
// ErrInvalid.
type ValidationError struct {
	Fields []FieldError
}

// Error prints one line per problem.
func (e *ValidationError) Error() string {
	lines := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		lines[i] = f.Error()
	}
	return strings.Join(lines, "\n")
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

type validator struct{ errs []FieldError }

func (v *validator) add(key, value, problem, fix string) {
	v.errs = append(v.errs, FieldError{Key: key, Value: value, Problem: problem, Fix: fix})
}

func (v *validator) required(key string) {
	v.add(key, "", "required", "set it in the config file or "+envName(key))
}

func (v *validator) oneOf(key, value string, allowed []string) {
	for _, a := range allowed {
		if value == a {
			return
		}
	}
	v.add(key, value, "not supported", "use one of "+strings.Join(allowed, ", "))
}

func (v *validator) durationRange(key string, d, lo, hi time.Duration, why string) {
	if d < lo || d > hi {
		problem := fmt.Sprintf("must be between %s and %s", lo, hi)
		if lo == 0 {
			problem = fmt.Sprintf("must be between 0 and %s", hi)
		}
		if why != "" {
			problem += " (" + why + ")"
		}
		v.add(key, d.String(), problem, "")
	}
}

func (v *validator) identifier(key, name string) {
	switch {
	case name == "":
		v.add(key, name, "must not be empty", "")
	case len(name) > maxIdentifierLen:
		v.add(key, name, fmt.Sprintf("longer than %d bytes, PostgreSQL's limit for a name", maxIdentifierLen), "")
	case !identifierRE.MatchString(name):
		v.add(key, name, "not a plain identifier",
			"use the name as stored in the catalog: letters, digits, _ and $, not starting with a digit")
	}
}

func (v *validator) err() error {
	if len(v.errs) == 0 {
		return nil
	}
	return &ValidationError{Fields: v.errs}
}

// Validate checks every rule and returns all problems at once as a
// *ValidationError, or nil.
func (c *Config) Validate() error {
	var v validator

	// postgres
	pg := c.Postgres
	if pg.DSN == "" {
		v.required("postgres.dsn")
	} else if p := dsnProblem(pg.DSN); p != "" {
		v.add("postgres.dsn", RedactDSN(pg.DSN), p,
			"use postgres://user@host:5432/db or host=... user=... dbname=...")
	}
	if !slotRE.MatchString(pg.Slot) {
		v.add("postgres.slot", pg.Slot, "not a valid replication slot name",
			"use 1 to 63 characters from a-z, 0-9 and _")
	}
	if !publicationRE.MatchString(pg.Publication) {
		v.add("postgres.publication", pg.Publication, "not a valid publication name",
			"use 1 to 63 characters from a-z, 0-9 and _, not starting with a digit")
	}
	v.durationRange("postgres.status_interval", pg.StatusInterval, minStatusInterval, maxStatusInterval,
		"it must stay well below the server's wal_sender_timeout")
	v.durationRange("postgres.reconnect_backoff_max", pg.ReconnectBackoffMax, minReconnectBackoffMax, maxReconnectBackoffMax, "")

	if _, _, err := RetainWindow(pg.Retain); err != nil {
		v.add("postgres.retain", pg.Retain, err.Error(), `use a duration such as "24h", a size such as "2GB", or "0"`)
	}
	if pg.HeartbeatInterval != 0 {
		v.durationRange("postgres.heartbeat_interval", pg.HeartbeatInterval, 100*time.Millisecond, time.Hour, "0 disables it")
	}
	if pg.PasswordFile != "" {
		if _, err := readSecretFile(pg.PasswordFile); err != nil {
			v.add("postgres.password_file", pg.PasswordFile, err.Error(),
				"give a file readable by this process that holds only the password")
		}
		if pg.DSN != "" && dsnHasPassword(pg.DSN) {
			v.add("postgres.password_file", pg.PasswordFile, "set while postgres.dsn has a password too",
				"remove the password from postgres.dsn (or "+envName("postgres.dsn")+"), or remove postgres.password_file")
		}
	}
	if pg.RetainedWALWarnBytes < 0 {
		v.add("postgres.retained_wal_warn_bytes", strconv.FormatInt(pg.RetainedWALWarnBytes, 10), "must not be negative", "0 disables the warning")
	}
	if pg.QueueBytes < minQueueBytes {
		v.add("postgres.queue_bytes", strconv.FormatInt(pg.QueueBytes, 10), fmt.Sprintf("must be at least %d (1 MiB)", minQueueBytes), "")
	}
	v.durationRange("postgres.receive_timeout", pg.ReceiveTimeout, minReceiveTimeout, maxReceiveTimeout,
		"PostgreSQL's own wal_receiver_timeout is 60s")

	// outbox
	ob := c.Outbox
	if ob.Table == "" {
		v.add("outbox.table", "", "must not be empty", "use schema.table or table (schema public)")
	} else {
		parts := strings.Split(ob.Table, ".")
		if len(parts) > 2 {
			v.add("outbox.table", ob.Table, "too many dots", "use schema.table or table (schema public)")
		} else {
			for _, p := range parts {
				before := len(v.errs)
				v.identifier("outbox.table", p)
				if len(v.errs) > before { // report the whole value, once
					v.errs[before].Value = ob.Table
					v.errs = v.errs[:before+1]
					break
				}
			}
		}
	}
	cols := []struct{ key, name string }{
		{"outbox.columns.id", ob.Columns.ID},
		{"outbox.columns.aggregate_type", ob.Columns.AggregateType},
		{"outbox.columns.aggregate_id", ob.Columns.AggregateID},
		{"outbox.columns.event_type", ob.Columns.EventType},
		{"outbox.columns.payload", ob.Columns.Payload},
	}
	for _, col := range cols {
		v.identifier(col.key, col.name)
	}
	seen := map[string]int{}
	for i, h := range ob.HeaderColumns {
		key := fmt.Sprintf("outbox.header_columns[%d]", i)
		v.identifier(key, h)
		if j, dup := seen[h]; dup {
			v.add(key, h, fmt.Sprintf("listed twice (also at index %d)", j), "remove one")
		}
		seen[h] = i
		for _, r := range reservedHeaders {
			if h == r {
				v.add(key, h, "the header "+r+" is always sent; a column with this name would give a second one",
					"remove it from outbox.header_columns")
			}
		}
	}

	// kafka
	k := c.Kafka
	if len(k.Brokers) == 0 {
		v.required("kafka.brokers")
	}
	for i, b := range k.Brokers {
		if p := hostPortProblem(b, false); p != "" {
			v.add(fmt.Sprintf("kafka.brokers[%d]", i), b, p, "use host:port, such as kafka1:9092")
		}
	}
	if p := topicTemplateProblem(k.Topic); p != "" {
		v.add("kafka.topic", k.Topic, p, "the only placeholder is "+TopicPlaceholder)
	}
	for _, at := range sortedKeys(k.Topics) {
		key := fmt.Sprintf("kafka.topics[%q]", at)
		if at == "" {
			v.add(key, "", "empty aggregate type", "remove the entry")
		}
		if err := CheckTopicName(k.Topics[at]); err != nil {
			v.add(key, k.Topics[at], err.Error(), "")
		}
	}
	if err := CheckTopicName(k.DLQTopic); err != nil {
		v.add("kafka.dlq_topic", k.DLQTopic, err.Error(), "")
	} else if clash := dlqClash(k); clash != "" {
		v.add("kafka.dlq_topic", k.DLQTopic, clash, "choose a dead-letter topic no event can be published to")
	}
	switch {
	case k.ClientID == "":
		v.add("kafka.client_id", "", "must not be empty", "")
	case len(k.ClientID) > maxClientIDLen:
		v.add("kafka.client_id", k.ClientID, fmt.Sprintf("longer than %d bytes", maxClientIDLen), "")
	}
	if k.MaxBufferedRecords < 1 {
		v.add("kafka.max_buffered_records", strconv.Itoa(k.MaxBufferedRecords), "must be at least 1", "")
	}
	if k.MaxBufferedBytes < minBufferedBytes {
		v.add("kafka.max_buffered_bytes", strconv.FormatInt(k.MaxBufferedBytes, 10),
			fmt.Sprintf("must be at least %d (1 MiB)", minBufferedBytes),
			"a record larger than this is dead-lettered, so keep it at or above the broker's message.max.bytes")
	}
	v.durationRange("kafka.linger", k.ProducerLinger, 0, maxLinger, "")
	v.durationRange("kafka.request_timeout", k.RequestTimeout, minRequestTimeout, maxRequestTimeout, "")
	v.durationRange("kafka.drain_timeout", k.DrainTimeout, time.Second, maxRequestTimeout, "")
	v.oneOf("kafka.compression", k.Compression, compressions)
	if k.TopicPartitions == 0 || k.TopicPartitions < -1 || k.TopicPartitions > maxTopicPartitions {
		v.add("kafka.topic_partitions", strconv.Itoa(k.TopicPartitions), fmt.Sprintf("must be -1 or 1 to %d", maxTopicPartitions),
			"use -1 for the broker's num.partitions")
	}
	if k.TopicReplicationFactor == 0 || k.TopicReplicationFactor < -1 || k.TopicReplicationFactor > maxReplicationFactor {
		v.add("kafka.topic_replication_factor", strconv.Itoa(k.TopicReplicationFactor), fmt.Sprintf("must be -1 or 1 to %d", maxReplicationFactor),
			"use -1 for the broker's default.replication.factor; 3 in production")
	}
	if k.UnknownTopicTimeout <= 0 {
		v.add("kafka.unknown_topic_timeout", k.UnknownTopicTimeout.String(), "must be positive",
			"use a duration such as 2m: how long records wait for a missing topic before they are dead-lettered")
	}
	v.kafkaTLS(k.TLS)
	v.kafkaSASL(k.SASL)

	// http
	if c.HTTP.Listen != "" {
		if p := hostPortProblem(c.HTTP.Listen, true); p != "" {
			v.add("http.listen", c.HTTP.Listen, p, `use host:port such as 127.0.0.1:9187, :9187 for all interfaces, or "" to disable`)
		}
	}

	// checkpoint
	v.oneOf("checkpoint.store", c.Checkpoint.Store, []string{"table", "file", "none"})
	switch c.Checkpoint.Store {
	case "table":
		parts := strings.Split(c.Checkpoint.Table, ".")
		if len(parts) != 2 {
			v.add("checkpoint.table", c.Checkpoint.Table, "not schema.table", "use schema.table, such as outbox_cdc.checkpoints")
		} else {
			v.identifier("checkpoint.table", parts[0])
			v.identifier("checkpoint.table", parts[1])
		}
	case "file":
		if c.Checkpoint.File == "" {
			v.add("checkpoint.file", "", "required when checkpoint.store is file", "set a path such as /var/lib/outbox-cdc/checkpoint")
		}
	}

	// snapshot
	v.oneOf("snapshot.mode", c.Snapshot.Mode, []string{"none", "pending"})
	if c.Snapshot.Filter != "" && c.Snapshot.Mode != "pending" {
		v.add("snapshot.filter", c.Snapshot.Filter, "only used with snapshot.mode pending", "set snapshot.mode: pending or remove the filter")
	}
	if strings.Contains(c.Snapshot.Filter, ";") {
		v.add("snapshot.filter", c.Snapshot.Filter, "must be a single SQL predicate", "remove the ';'")
	}
	if c.Snapshot.OrderBy != "" { // also the order of the gap repair, in every mode
		v.identifier("snapshot.order_by", c.Snapshot.OrderBy)
	}
	// The "snapshot started" marker lives in the checkpoint: without one an
	// interrupted snapshot would never be taken again.
	if c.Snapshot.Mode == "pending" && c.Checkpoint.Store == "none" {
		v.add("snapshot.mode", c.Snapshot.Mode, "pending needs a checkpoint store to redo an interrupted snapshot, but checkpoint.store is none",
			"set checkpoint.store: table (or file), or snapshot.mode: none")
	}

	// log
	v.oneOf("log.level", c.Log.Level, logLevels)
	v.oneOf("log.format", c.Log.Format, logFormats)

	return v.err()
}

// kafkaTLS checks the kafka.tls section, reading the files it names.
func (v *validator) kafkaTLS(t KafkaTLS) {
	if !t.Enabled {
		for _, f := range []struct {
			key, value string
			set        bool
		}{
			{"kafka.tls.ca_file", t.CAFile, t.CAFile != ""},
			{"kafka.tls.cert_file", t.CertFile, t.CertFile != ""},
			{"kafka.tls.key_file", t.KeyFile, t.KeyFile != ""},
			{"kafka.tls.server_name", t.ServerName, t.ServerName != ""},
			{"kafka.tls.insecure_skip_verify", "true", t.InsecureSkipVerify},
		} {
			if f.set {
				v.add(f.key, f.value, "set while kafka.tls.enabled is false, so the connection would not use it",
					"set kafka.tls.enabled: true ("+envName("kafka.tls.enabled")+"=true), or remove "+f.key)
			}
		}
		return
	}
	if t.CAFile != "" {
		if p := checkCAFile(t.CAFile); p != "" {
			v.add("kafka.tls.ca_file", t.CAFile, p,
				"give a readable PEM file with the certificate of the authority that signs the brokers' certificates")
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		v.add("kafka.tls.key_file", "", "required when kafka.tls.cert_file is set",
			"set it to the PEM private key of the client certificate, or remove kafka.tls.cert_file")
	case t.KeyFile != "" && t.CertFile == "":
		v.add("kafka.tls.cert_file", "", "required when kafka.tls.key_file is set",
			"set it to the PEM client certificate of that key, or remove kafka.tls.key_file")
	case t.CertFile != "":
		certP, keyP, pairP := checkKeyPair(t.CertFile, t.KeyFile)
		if certP != "" {
			v.add("kafka.tls.cert_file", t.CertFile, certP, "give a readable PEM file with the client certificate (and its chain)")
		}
		if keyP != "" {
			v.add("kafka.tls.key_file", t.KeyFile, keyP, "give a readable PEM file with the client certificate's unencrypted private key")
		}
		if pairP != "" {
			v.add("kafka.tls.key_file", t.KeyFile, "does not go with kafka.tls.cert_file: "+pairP,
				"give the private key that belongs to the certificate in kafka.tls.cert_file")
		}
	}
	if t.ServerName != "" && net.ParseIP(t.ServerName) == nil && strings.ContainsAny(t.ServerName, " \t/:") {
		v.add("kafka.tls.server_name", t.ServerName, "not a host name",
			"give the DNS name (or IP address) the brokers' certificates are issued for, without port")
	}
}

var saslMechanisms = []string{SASLPlain, SASLScramSHA256, SASLScramSHA512}

// kafkaSASL checks the kafka.sasl section, reading the password file. No
// message shows the password.
func (v *validator) kafkaSASL(s KafkaSASL) {
	if s.Mechanism == "" {
		if s.Username != "" || s.Password != "" || s.PasswordFile != "" {
			v.add("kafka.sasl.mechanism", "", "empty while other kafka.sasl keys are set, so the connection would not authenticate",
				"set it to one of "+strings.Join(saslMechanisms, ", ")+" ("+envName("kafka.sasl.mechanism")+"), or remove the other kafka.sasl keys")
		}
		return
	}
	if !slices.Contains(saslMechanisms, s.Mechanism) {
		fix := "use one of " + strings.Join(saslMechanisms, ", ") + `, or "" for no SASL`
		if up := strings.ToUpper(s.Mechanism); slices.Contains(saslMechanisms, up) {
			fix = "write it in upper case: " + up
		}
		v.add("kafka.sasl.mechanism", s.Mechanism, "not supported", fix)
	}
	if s.Username == "" {
		v.add("kafka.sasl.username", "", "required when kafka.sasl.mechanism is set",
			"set it in the config file or "+envName("kafka.sasl.username"))
	}
	switch {
	case s.Password != "" && s.PasswordFile != "":
		v.add("kafka.sasl.password", "", "set together with kafka.sasl.password_file",
			"keep one: remove kafka.sasl.password (and "+envName("kafka.sasl.password")+") or kafka.sasl.password_file")
	case s.Password == "" && s.PasswordFile == "":
		v.add("kafka.sasl.password", "", "required when kafka.sasl.mechanism is set",
			"set kafka.sasl.password_file to a file holding it, or "+envName("kafka.sasl.password"))
	case s.PasswordFile != "":
		if _, err := readSecretFile(s.PasswordFile); err != nil {
			v.add("kafka.sasl.password_file", s.PasswordFile, err.Error(),
				"give a file readable by this process that holds only the password")
		}
	}
}

// hostPortProblem checks host:port. The host may be empty only for a listen
// address; port 0 is allowed only there too.
func hostPortProblem(s string, listen bool) string {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "not host:port"
	}
	if host == "" && !listen {
		return "missing host"
	}
	n, err := strconv.Atoi(port)
	lo := 1
	if listen {
		lo = 0
	}
	if err != nil || n < lo || n > 65535 {
		return "port must be a number from " + strconv.Itoa(lo) + " to 65535"
	}
	return ""
}

// CheckTopicName reports whether Kafka accepts name as a topic name: 1 to 249
// characters from [a-zA-Z0-9._-], and not "." or "..".
func CheckTopicName(name string) error {
	switch {
	case name == "":
		return errors.New("empty topic name")
	case len(name) > maxTopicLen:
		return fmt.Errorf("topic name longer than %d characters", maxTopicLen)
	case name == "." || name == "..":
		return errors.New(`topic name cannot be "." or ".."`)
	case !topicCharsRE.MatchString(name):
		return errors.New("topic name may only contain letters, digits, '.', '_' and '-'")
	}
	return nil
}

// topicTemplateProblem checks kafka.topic: {aggregate_type} is the only
// placeholder, and the rest is legal in a topic name.
func topicTemplateProblem(t string) string {
	if t == "" {
		return "must not be empty"
	}
	var literal strings.Builder
	placeholders := 0
	for rest := t; rest != ""; {
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			literal.WriteString(rest)
			break
		}
		if rest[open] == '}' {
			return "unmatched }"
		}
		literal.WriteString(rest[:open])
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return "unmatched {"
		}
		ph := rest[open : open+end+1]
		if ph != TopicPlaceholder {
			return "unknown placeholder " + ph
		}
		placeholders++
		rest = rest[open+end+1:]
	}
	lit := literal.String()
	if !topicCharsRE.MatchString(lit) {
		return "a topic name may only contain letters, digits, '.', '_' and '-'"
	}
	if placeholders == 0 {
		if err := CheckTopicName(t); err != nil {
			return err.Error()
		}
		return ""
	}
	if len(lit)+placeholders > maxTopicLen {
		return fmt.Sprintf("too long: a topic name has at most %d characters", maxTopicLen)
	}
	return ""
}

// dlqClash reports whether an event could be published to the dead-letter
// topic: it is a kafka.topics value or a name the template can produce.
func dlqClash(k Kafka) string {
	for _, at := range sortedKeys(k.Topics) {
		if k.Topics[at] == k.DLQTopic {
			return fmt.Sprintf("same as kafka.topics[%q]", at)
		}
	}
	// A bare {aggregate_type} can produce any name; rejecting every DLQ
	// topic for it would forbid a common setup, so only a template with
	// literal text (a namespace for event topics) is checked.
	if topicTemplateProblem(k.Topic) != "" || k.Topic == TopicPlaceholder {
		return ""
	}
	parts := strings.Split(k.Topic, TopicPlaceholder)
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	re := regexp.MustCompile("^" + strings.Join(parts, "([a-zA-Z0-9._-]+)") + "$")
	m := re.FindStringSubmatch(k.DLQTopic)
	switch {
	case m == nil:
		return ""
	case len(m) == 1:
		return "same as kafka.topic"
	default:
		return fmt.Sprintf("kafka.topic publishes events of aggregate_type %q to it", m[1])
	}
}
