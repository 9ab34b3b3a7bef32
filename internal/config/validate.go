package config

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
)

var (
	slotRE        = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	publicationRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	identifierRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*$`)
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
	s := e.Key
	if e.Value != "" {
		s += " = " + strconv.Quote(e.Value)
	}
	s += ": " + e.Problem
	if e.Fix != "" {
		s += "; " + e.Fix
	}
	return s
}

// join returns the problems as one error that prints a line each
// (errors.Join); nil when there are none.
func join(problems []FieldError) error {
	errs := make([]error, len(problems))
	for i, p := range problems {
		errs[i] = p
	}
	return errors.Join(errs...)
}

type validator struct{ errs []FieldError }

func (v *validator) add(key, value, problem, fix string) {
	v.errs = append(v.errs, FieldError{Key: key, Value: value, Problem: problem, Fix: fix})
}

func (v *validator) oneOf(key, value string, allowed []string) {
	if !slices.Contains(allowed, value) {
		v.add(key, value, "not supported", "use one of "+strings.Join(allowed, ", "))
	}
}

func (v *validator) durationRange(key string, d, lo, hi time.Duration, why string) {
	if d >= lo && d <= hi {
		return
	}
	problem := fmt.Sprintf("must be between %s and %s", lo, hi)
	if lo == 0 {
		problem = fmt.Sprintf("must be between 0 and %s", hi)
	}
	if why != "" {
		problem += " (" + why + ")"
	}
	v.add(key, d.String(), problem, "")
}

// identifier checks a catalog name; it reports whether the name is good.
func (v *validator) identifier(key, name, shown string) bool {
	switch {
	case name == "":
		v.add(key, shown, "must not be empty", "")
	case len(name) > 63:
		v.add(key, shown, "longer than 63 bytes, PostgreSQL's limit for a name", "")
	case !identifierRE.MatchString(name):
		v.add(key, shown, "not a plain identifier",
			"use the name as stored in the catalog: letters, digits, _ and $, not starting with a digit")
	default:
		return true
	}
	return false
}

// Validate checks every rule and returns all problems at once, joined (see
// join), or nil. It reads the files the configuration names.
func (c *Config) Validate() error { return join(c.problems()) }

// problems lists what breaks the rules, in the order of the keys.
func (c *Config) problems() []FieldError {
	var v validator
	v.postgres(c.Postgres)
	v.outbox(c.Outbox)
	v.retention(c.Outbox, c.Checkpoint.Store) // retention.go
	v.tracing(c.Outbox, c.OTel)
	v.kafka(c.Kafka)
	v.dlq(c.DLQ, c.Kafka)
	v.delivery(c.Kafka, c.DLQ, c.Snapshot)
	v.txnHeaders(c)
	v.snapshotIDs(c)
	v.eventRouter(c)
	v.tables(c)
	v.contracts(c.Contracts, c.DLQ) // contracts.go
	v.contractsEncode(c)
	if p := hostPortProblem(c.HTTP.Listen, true); c.HTTP.Listen != "" && p != "" {
		v.add("http.listen", c.HTTP.Listen, p, `use host:port such as 127.0.0.1:9187, :9187 for all interfaces, or "" to disable`)
	}
	switch {
	case c.HTTP.PProf && c.HTTP.Listen == "":
		v.add("http.pprof", "true", "needs http.listen", "set http.listen (e.g. 127.0.0.1:9187) or http.pprof false")
	case c.HTTP.PProf && !c.HTTP.PProfAnyAddress && !loopback(c.HTTP.Listen):
		v.add("http.pprof", "true",
			fmt.Sprintf("serves the profiler (heap contents, secrets included, and stacks) on http.listen %s, which is not a loopback address", c.HTTP.Listen),
			"listen on 127.0.0.1 (kubectl port-forward reaches it), or set http.pprof_any_address: true to serve it there anyway, behind a NetworkPolicy")
	}

	v.oneOf("checkpoint.store", c.Checkpoint.Store, []string{"table", "file", "none"})
	switch s, t, ok := strings.Cut(c.Checkpoint.Table, "."); {
	case c.Checkpoint.Store == "table" && (!ok || strings.Contains(t, ".")):
		v.add("checkpoint.table", c.Checkpoint.Table, "not schema.table", "use schema.table, such as outbox_cdc.checkpoints")
	case c.Checkpoint.Store == "table":
		v.identifier("checkpoint.table", s, s)
		v.identifier("checkpoint.table", t, t)
	case c.Checkpoint.Store == "file" && c.Checkpoint.File == "":
		v.add("checkpoint.file", "", "required when checkpoint.store is file", "set a path such as /var/lib/outbox-cdc/checkpoint")
	}

	s := c.Snapshot
	v.oneOf("snapshot.mode", s.Mode, []string{"none", "pending"})
	if s.Filter != "" && s.Mode != "pending" {
		v.add("snapshot.filter", s.Filter, "only used with snapshot.mode pending", "set snapshot.mode: pending or remove the filter")
	}
	if strings.Contains(s.Filter, ";") {
		v.add("snapshot.filter", s.Filter, "must be a single SQL predicate", "remove the ';'")
	}
	if s.OrderBy != "" { // also the order of the gap repair, in every mode
		v.identifier("snapshot.order_by", s.OrderBy, s.OrderBy)
	}
	// The "snapshot started" marker lives in the checkpoint: without one an
	// interrupted snapshot would never be taken again.
	if s.Mode == "pending" && c.Checkpoint.Store == "none" {
		v.add("snapshot.mode", s.Mode, "pending needs a checkpoint store to redo an interrupted snapshot, but checkpoint.store is none",
			"set checkpoint.store: table (or file), or snapshot.mode: none")
	}

	v.oneOf("log.level", c.Log.Level, []string{"debug", "info", "warn", "error"})
	v.oneOf("log.format", c.Log.Format, []string{"text", "json"})
	return v.errs
}

func (v *validator) postgres(pg Postgres) {
	if pg.DSN == "" {
		v.add("postgres.dsn", "", "required", "set it in the config file or "+envName("postgres.dsn"))
	} else if p := dsnProblem(string(pg.DSN)); p != "" {
		v.add("postgres.dsn", pg.DSN.String(), p, "use postgres://user@host:5432/db or host=... user=... dbname=...")
	}
	switch p := dsnProblem(string(pg.PrimaryDSN)); {
	case pg.PrimaryDSN == "":
	case p != "":
		v.add("postgres.primary_dsn", pg.PrimaryDSN.String(), p, "use postgres://user@host:5432/db or host=... user=... dbname=...")
	case pg.PrimaryDSN == pg.DSN:
		v.add("postgres.primary_dsn", pg.PrimaryDSN.String(), "the same as postgres.dsn",
			"unset it: it names the primary when postgres.dsn is a standby")
	}
	if !slotRE.MatchString(pg.Slot) {
		v.add("postgres.slot", pg.Slot, "not a valid replication slot name", "use 1 to 63 characters from a-z, 0-9 and _")
	}
	if !publicationRE.MatchString(pg.Publication) {
		v.add("postgres.publication", pg.Publication, "not a valid publication name",
			"use 1 to 63 characters from a-z, 0-9 and _, not starting with a digit")
	}
	// Status updates double as keepalives: far below wal_sender_timeout
	// (60s by default); a tiny interval only burns CPU.
	v.durationRange("postgres.status_interval", pg.StatusInterval, 10*time.Millisecond, 30*time.Second,
		"it must stay well below the server's wal_sender_timeout")
	v.durationRange("postgres.reconnect_backoff_max", pg.ReconnectBackoffMax, 100*time.Millisecond, 10*time.Minute, "")
	if _, _, err := RetainWindow(pg.Retain); err != nil {
		v.add("postgres.retain", pg.Retain, err.Error(), `use a duration such as "24h", a size such as "2GB", or "0"`)
	}
	if pg.HeartbeatInterval != 0 {
		v.durationRange("postgres.heartbeat_interval", pg.HeartbeatInterval, 100*time.Millisecond, time.Hour, "0 disables it")
	}
	if pg.PasswordFile != "" {
		if _, err := kafkaopt.ReadSecretFile(pg.PasswordFile); err != nil {
			v.add("postgres.password_file", pg.PasswordFile, err.Error(),
				"give a file readable by this process that holds only the password")
		}
		keys := [...]string{"postgres.dsn", "postgres.primary_dsn"}
		for i, dsn := range []DSN{pg.DSN, pg.PrimaryDSN} {
			if dsnHasPassword(string(dsn)) {
				v.add("postgres.password_file", pg.PasswordFile, "set while "+keys[i]+" has a password too",
					"remove the password from "+keys[i]+" (or "+envName(keys[i])+"), or remove postgres.password_file")
			}
		}
	}
	v.passwordCommand(pg)
	if pg.RetainedWALWarnBytes < 0 {
		v.add("postgres.retained_wal_warn_bytes", strconv.FormatInt(pg.RetainedWALWarnBytes, 10), "must not be negative", "0 disables the warning")
	}
	// Below 1 MiB the stream hands rows over one or two at a time.
	if pg.QueueBytes < 1<<20 {
		v.add("postgres.queue_bytes", strconv.FormatInt(pg.QueueBytes, 10), fmt.Sprintf("must be at least %d (1 MiB)", 1<<20), "")
	}
	// Below a second a busy server can miss a ping; above an hour a dead
	// connection goes unnoticed for too long.
	v.durationRange("postgres.receive_timeout", pg.ReceiveTimeout, time.Second, time.Hour,
		"PostgreSQL's own wal_receiver_timeout is 60s")
	v.oneOf("postgres.failover_slot", pg.FailoverSlot, []string{"auto", "on", "off"})
}

func (v *validator) outbox(ob Outbox) {
	const tableFix = "use schema.table or table (schema public)"
	switch parts := strings.Split(ob.Table, "."); {
	case len(ob.Tables) > 0: // checked with each entry (tables.go)
	case ob.Table == "":
		v.add("outbox.table", "", "must not be empty", tableFix)
	case len(parts) > 2:
		v.add("outbox.table", ob.Table, "too many dots", tableFix)
	default:
		for _, p := range parts {
			if !v.identifier("outbox.table", p, ob.Table) { // the whole value, once
				break
			}
		}
	}
	c := ob.Columns
	v.identifier("outbox.columns.id", c.ID, c.ID)
	v.identifier("outbox.columns.aggregate_type", c.AggregateType, c.AggregateType)
	v.identifier("outbox.columns.aggregate_id", c.AggregateID, c.AggregateID)
	v.identifier("outbox.columns.event_type", c.EventType, c.EventType)
	v.identifier("outbox.columns.payload", c.Payload, c.Payload)
	seen := map[string]int{}
	for i, h := range ob.HeaderColumns {
		key := fmt.Sprintf("outbox.header_columns[%d]", i)
		v.identifier(key, h, h)
		if j, dup := seen[h]; dup {
			v.add(key, h, fmt.Sprintf("listed twice (also at index %d)", j), "remove one")
		}
		seen[h] = i
		if wire.Reserved(h) { // a fixed header of every record
			v.add(key, h, "the header "+h+" is always sent; a column with this name would give a second one",
				"remove it from outbox.header_columns")
		}
	}
}

func (v *validator) kafka(k Kafka) {
	if len(k.Brokers) == 0 {
		v.add("kafka.brokers", "", "required", "set it in the config file or "+envName("kafka.brokers"))
	}
	for i, b := range k.Brokers {
		if p := hostPortProblem(b, false); p != "" {
			v.add(fmt.Sprintf("kafka.brokers[%d]", i), b, p, "use host:port, such as kafka1:9092")
		}
	}
	v.routes(k)
	switch {
	case k.ClientID == "":
		v.add("kafka.client_id", "", "must not be empty", "")
	case len(k.ClientID) > 256: // franz-go's limit
		v.add("kafka.client_id", k.ClientID, "longer than 256 bytes", "")
	}
	if k.MaxBufferedRecords < 1 {
		v.add("kafka.max_buffered_records", strconv.Itoa(k.MaxBufferedRecords), "must be at least 1", "")
	}
	// Below 1 MiB, the broker's default message.max.bytes, records it accepts would be dead-lettered.
	if k.MaxBufferedBytes < 1<<20 {
		v.add("kafka.max_buffered_bytes", strconv.FormatInt(k.MaxBufferedBytes, 10), fmt.Sprintf("must be at least %d (1 MiB)", 1<<20),
			"a record larger than this is dead-lettered, so keep it at or above the broker's message.max.bytes")
	}
	// franz-go's bounds: linger up to 1m, request timeouts 100ms to 15m.
	v.durationRange("kafka.linger", k.ProducerLinger, 0, time.Minute, "")
	v.durationRange("kafka.latency_budget", k.LatencyBudget, 0, time.Second, "")
	if k.ProducerLinger > 0 && k.LatencyBudget > 0 {
		// The two waits would add up: the gate's hold, then franz-go's linger.
		v.add("kafka.latency_budget", k.LatencyBudget.String(), "cannot be combined with kafka.linger "+k.ProducerLinger.String(),
			"set one: kafka.latency_budget adapts the wait to the load, kafka.linger fixes it (latency_budget: 0s turns the budget off)")
	}
	v.durationRange("kafka.request_timeout", k.RequestTimeout, 100*time.Millisecond, 15*time.Minute, "")
	v.durationRange("kafka.drain_timeout", k.DrainTimeout, time.Second, 15*time.Minute, "")
	v.oneOf("kafka.compression", k.Compression, kafkaopt.Compressions())
	// CreateTopics takes int32 partitions and an int16 replication factor.
	if n := k.TopicPartitions; n == 0 || n < -1 || n > 1<<20 {
		v.add("kafka.topic_partitions", strconv.Itoa(n), fmt.Sprintf("must be -1 or 1 to %d", 1<<20),
			"use -1 for the broker's num.partitions")
	}
	if n := k.TopicReplicationFactor; n == 0 || n < -1 || n > 1<<15-1 {
		v.add("kafka.topic_replication_factor", strconv.Itoa(n), fmt.Sprintf("must be -1 or 1 to %d", 1<<15-1),
			"use -1 for the broker's default.replication.factor; 3 in production")
	}
	if k.UnknownTopicTimeout <= 0 {
		v.add("kafka.unknown_topic_timeout", k.UnknownTopicTimeout.String(), "must be positive",
			"use a duration such as 2m: how long records wait for a missing topic before they are dead-lettered")
	}
	v.kafkaTLS(k.TLS)
	v.kafkaSASL(k.SASL)
}

// routes checks the kafka keys an outbox.tables entry may override.
func (v *validator) routes(k Kafka) {
	for _, p := range (router.Config{TopicTemplate: k.Topic, Topics: k.Topics, DLQTopic: k.DLQTopic,
		TopicRegex: k.TopicRegex, TopicReplacement: k.TopicReplacement}).Check() {
		v.add(p.Key, p.Value, p.Reason, p.Fix)
	}
	for _, p := range router.CheckCloudEvents(k.Format, router.CloudEvents(k.CloudEvents)) {
		v.add(p.Key, p.Value, p.Reason, p.Fix)
	}
}

// kafkaTLS checks the kafka.tls section.
func (v *validator) kafkaTLS(t KafkaTLS) { v.tlsSection("kafka.tls", t) }

// tlsSection checks a TLS section (kafka.tls, contracts.registry.tls): keys
// that TLS off would ignore, and what kafkaopt.CheckTLS finds, reading the
// files as the connection will; its problems name kafka.tls keys, renamed
// here to the section's.
func (v *validator) tlsSection(prefix string, t KafkaTLS) {
	rename := func(s string) string { return strings.ReplaceAll(s, "kafka.tls.", prefix+".") }
	if t.Enabled {
		for _, p := range kafkaopt.CheckTLS(*t.Sink()) {
			v.add(rename(p.Key), p.Value, rename(p.Problem), rename(p.Fix))
		}
		return
	}
	rv := reflect.ValueOf(t)
	for i := 1; i < rv.NumField(); i++ { // the keys after enabled
		if f := rv.Field(i); !f.IsZero() {
			key := prefix + "." + rv.Type().Field(i).Tag.Get("koanf")
			v.add(key, fmt.Sprint(f), "set while "+prefix+".enabled is false, so the connection would not use it",
				"set "+prefix+".enabled: true ("+envName(prefix+".enabled")+"=true), or remove "+key)
		}
	}
}

// kafkaSASL checks the kafka.sasl section, reading the password file. No
// message shows the password.
func (v *validator) kafkaSASL(s KafkaSASL) {
	if v.kafkaTokenSASL(s) {
		return
	}
	if s.Mechanism == "" {
		if s.Username != "" || s.Password != "" || s.PasswordFile != "" {
			v.add("kafka.sasl.mechanism", "", "empty while other kafka.sasl keys are set, so the connection would not authenticate",
				"set it to one of "+strings.Join(kafkaopt.Mechanisms(), ", ")+" ("+envName("kafka.sasl.mechanism")+"), or remove the other kafka.sasl keys")
		}
		return
	}
	if known := kafkaopt.Mechanisms(); !slices.Contains(known, s.Mechanism) {
		fix := "use one of " + strings.Join(known, ", ") + `, or "" for no SASL`
		if up := strings.ToUpper(s.Mechanism); slices.Contains(known, up) {
			fix = "write it in upper case: " + up
		}
		v.add("kafka.sasl.mechanism", s.Mechanism, "not supported", fix)
	}
	if s.Username == "" {
		v.add("kafka.sasl.username", "", "required when kafka.sasl.mechanism is set",
			"set it in the config file or "+envName("kafka.sasl.username"))
	}
	v.secretOrFile("kafka.sasl.password", s.Password != "", s.PasswordFile, "required when kafka.sasl.mechanism is set", "password")
}

// hostPortProblem checks host:port. The host may be empty only for a listen
// address; port 0 is allowed only there too.
// loopback reports whether a listen address (host:port) accepts only
// connections from this host: a loopback IP or localhost. "" and 0.0.0.0
// listen on every interface; a host name may resolve anywhere.
func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func hostPortProblem(s string, listen bool) string {
	lo := 1
	if listen {
		lo = 0
	}
	host, port, err := net.SplitHostPort(s)
	switch n, perr := strconv.Atoi(port); {
	case err != nil:
		return "not host:port"
	case host == "" && !listen:
		return "missing host"
	case perr != nil || n < lo || n > 65535:
		return fmt.Sprintf("port must be a number from %d to 65535", lo)
	}
	return ""
}
