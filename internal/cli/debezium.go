package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// eventRouterClass is the transform fromDebezium translates.
const eventRouterClass = "io.debezium.transforms.outbox.EventRouter"

// runFromDebezium prints the outbox-cdc YAML for a Debezium PostgreSQL
// connector's .properties file (docs/operations.md, "Cut-over from Debezium's
// outbox event router"); what has no equivalent is reported on stderr.
func runFromDebezium(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(stderr, "usage: outbox-cdc from-debezium FILE.properties\n")
		return ExitUsage
	}
	f, err := os.Open(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "outbox-cdc: %v\n", err)
		return ExitUsage
	}
	defer f.Close()
	props, err := readProperties(f)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-cdc: %s: %v\n", args[0], err)
		return ExitUsage
	}
	yaml, notes, err := fromDebezium(props)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-cdc: %s: %v\n", args[0], err)
		return ExitUsage
	}
	fmt.Fprint(stdout, yaml)
	for _, n := range notes {
		fmt.Fprintf(stderr, "note: %s\n", n)
	}
	return ExitOK
}

// readProperties reads a Java .properties file: key=value or key: value,
// # and ! comments, a trailing backslash continuing the line. Escapes other
// than the continuation are kept as written (connector configs rarely use
// them; a regex's backslashes must survive).
func readProperties(r io.Reader) (map[string]string, error) {
	props := map[string]string{}
	sc := bufio.NewScanner(r)
	var pending string
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimLeft(sc.Text(), " \t\f")
		if pending == "" && (line == "" || line[0] == '#' || line[0] == '!') {
			continue
		}
		if strings.HasSuffix(line, `\`) && !strings.HasSuffix(line, `\\`) {
			pending += strings.TrimSuffix(line, `\`)
			continue
		}
		line, pending = pending+line, ""
		i := strings.IndexAny(line, "=:")
		if i < 0 {
			return nil, fmt.Errorf("line %d: %q is not key=value", n, line)
		}
		props[strings.TrimSpace(line[:i])] = strings.TrimSpace(line[i+1:])
	}
	return props, sc.Err()
}

// fromDebezium translates connector properties into outbox-cdc YAML and the
// notes on what does not carry over.
func fromDebezium(p map[string]string) (yaml string, notes []string, err error) {
	t := &dbzTranslation{p: p}
	for _, name := range strings.Split(p["transforms"], ",") {
		if name = strings.TrimSpace(name); name != "" && p["transforms."+name+".type"] == eventRouterClass {
			t.prefix = "transforms." + name + "."
		}
	}
	if t.prefix == "" {
		return "", nil, fmt.Errorf("no transform of type %s in transforms", eventRouterClass)
	}
	t.postgres()
	if err := t.outbox(); err != nil {
		return "", nil, err
	}
	t.kafka()
	t.unsupportedRouter()
	if !t.contracts() {
		t.valueConverter()
	}
	t.unsupportedSource()
	return t.b.String(), t.notes, nil
}

// dbzTranslation is one translation under way: the properties, the
// EventRouter's key prefix, the YAML written so far and the notes.
type dbzTranslation struct {
	p      map[string]string
	prefix string // "transforms.<name>."
	b      strings.Builder
	notes  []string
}

// opt is the EventRouter option key, or def when it is not set.
func (t *dbzTranslation) opt(key, def string) string {
	if v, ok := t.p[t.prefix+key]; ok {
		return v
	}
	return def
}

// yamlQuote quotes s for YAML: a JSON string is a YAML scalar.
func yamlQuote(s string) string {
	var j bytes.Buffer
	enc := json.NewEncoder(&j)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(j.String(), "\n")
}

func (t *dbzTranslation) postgres() {
	p, b := t.p, &t.b
	b.WriteString("postgres:\n")
	dsn := url.URL{Scheme: "postgres", Host: p["database.hostname"], Path: "/" + p["database.dbname"]}
	if port := p["database.port"]; port != "" {
		dsn.Host += ":" + port
	}
	if u := p["database.user"]; u != "" {
		dsn.User = url.User(u)
	}
	if dsn.Host == "" {
		b.WriteString("  dsn: \"\"  # database.hostname, port, user and dbname were not in the file\n")
	} else {
		fmt.Fprintf(b, "  dsn: %s\n", yamlQuote(dsn.String()))
	}
	if _, ok := p["database.password"]; ok {
		t.notes = append(t.notes, "database.password is not copied: set postgres.password_file or OUTBOX_CDC_POSTGRES_DSN")
	}
	for _, kv := range [][2]string{{"slot.name", "slot"}, {"publication.name", "publication"}} {
		if v := p[kv[0]]; v != "" {
			fmt.Fprintf(b, "  %s: %s\n", kv[1], yamlQuote(v))
		}
	}
	if ms := p["heartbeat.interval.ms"]; ms != "" {
		if n, err := strconv.Atoi(ms); err == nil && n > 0 {
			fmt.Fprintf(b, "  heartbeat_interval: %s\n", time.Duration(n)*time.Millisecond)
		}
	}
}

func (t *dbzTranslation) outbox() error {
	b := &t.b
	b.WriteString("outbox:\n")
	var tables []string
	for _, tb := range strings.Split(t.p["table.include.list"], ",") {
		if tb = strings.TrimSpace(tb); tb != "" {
			tables = append(tables, tb)
		}
	}
	switch len(tables) {
	case 0:
		return fmt.Errorf("table.include.list must name the outbox tables, it is %q", t.p["table.include.list"])
	case 1:
		fmt.Fprintf(b, "  table: %s\n", yamlQuote(tables[0]))
	default:
		// One EventRouter for every table: they share the mapping and the
		// routing below, which each entry of outbox.tables inherits.
		b.WriteString("  tables:\n")
		for _, tb := range tables {
			fmt.Fprintf(b, "    - table: %s\n", yamlQuote(tb))
		}
	}
	fmt.Fprintf(b, "  columns:\n    id: %s\n    aggregate_id: %s\n    aggregate_type: %s\n    event_type: %s\n    payload: %s\n",
		yamlQuote(t.opt("table.field.event.id", "id")), yamlQuote(t.opt("table.field.event.key", "aggregateid")),
		yamlQuote(t.opt("route.by.field", "aggregatetype")), yamlQuote(t.opt("table.field.event.type", "type")),
		yamlQuote(t.opt("table.field.event.payload", "payload")))
	b.WriteString("  standard_headers: [id]\n")
	if v := t.opt("table.fields.additional.placement", ""); v != "" {
		var fs []string
		for _, f := range strings.Split(v, ",") {
			fs = append(fs, yamlQuote(strings.TrimSpace(f)))
		}
		fmt.Fprintf(b, "  fields: [%s]\n", strings.Join(fs, ", "))
	}
	if v := t.opt("table.field.event.timestamp", ""); v != "" {
		fmt.Fprintf(b, "  timestamp_column: %s\n", yamlQuote(v))
	}
	if strings.EqualFold(t.opt("route.tombstone.on.empty.payload", "false"), "true") {
		b.WriteString("  tombstone_on_empty_payload: true\n")
	}
	return nil
}

func (t *dbzTranslation) kafka() {
	b := &t.b
	b.WriteString("kafka:\n  brokers: []  # the Kafka Connect worker's bootstrap.servers\n")
	regex := t.opt("route.topic.regex", "(?<routedByValue>.*)")
	repl := t.opt("route.topic.replacement", "outbox.event.${routedByValue}")
	if regex == "(?<routedByValue>.*)" && !strings.ContainsAny(strings.ReplaceAll(repl, "${routedByValue}", ""), `$\{}`) {
		fmt.Fprintf(b, "  topic: %s\n", yamlQuote(strings.ReplaceAll(repl, "${routedByValue}", "{aggregate_type}")))
	} else {
		fmt.Fprintf(b, "  topic: \"{aggregate_type}\"\n  topic_regex: %s\n  topic_replacement: %s\n", yamlQuote(regex), yamlQuote(repl))
	}
	if v := t.p["errors.deadletterqueue.topic.name"]; v != "" {
		fmt.Fprintf(b, "  dlq_topic: %s\n", yamlQuote(v))
	}
}

// valueConverter notes what a converter other than a schema registry's
// does that outbox-cdc does not.
func (t *dbzTranslation) valueConverter() {
	p := t.p
	switch vc := p["value.converter"]; vc {
	case "", "org.apache.kafka.connect.storage.StringConverter", "io.debezium.converters.BinaryDataConverter":
	case "org.apache.kafka.connect.json.JsonConverter":
		if !strings.EqualFold(p["value.converter.schemas.enable"], "false") {
			t.notes = append(t.notes, "value.converter JsonConverter with schemas: outbox-cdc writes the envelope without schemas")
		}
		if !strings.Contains(t.opt("table.fields.additional.placement", ""), ":envelope") {
			t.notes = append(t.notes, "value.converter JsonConverter without an envelope quotes the payload as a JSON string; outbox-cdc sends it as is")
		}
	default:
		t.notes = append(t.notes, "value.converter="+vc+" has no equivalent: values are the payload bytes or the JSON envelope")
	}
}

// unsupportedRouter notes the EventRouter options without an equivalent.
func (t *dbzTranslation) unsupportedRouter() {
	p, prefix := t.p, t.prefix
	for _, k := range []string{"table.expand.json.payload", "table.field.event.schema.version", "table.json.payload.null.behavior",
		"table.json.payload.empty.array.behavior", "tracing.span.context.field", "tracing.operation.name", "tracing.with.context.field.only"} {
		if v, ok := p[prefix+k]; ok && !(k == "table.expand.json.payload" && strings.EqualFold(v, "false")) {
			t.notes = append(t.notes, fmt.Sprintf("%s%s=%s has no equivalent (docs/operations.md)", prefix, k, v))
		}
	}
	if strings.EqualFold(t.opt("table.field.additional.missing", "error"), "ignore") {
		t.notes = append(t.notes, prefix+"table.field.additional.missing=ignore: outbox-cdc stops on a missing column instead")
	}
}

// unsupportedSource notes the connector options without an equivalent.
func (t *dbzTranslation) unsupportedSource() {
	p := t.p
	if !strings.EqualFold(p["extended.headers.enabled"], "false") {
		// On by default in Debezium: every record carries them there.
		t.notes = append(t.notes, "extended.headers.enabled: Debezium's __debezium.context.* headers are not sent (docs/operations.md)")
	}
	if p["snapshot.mode"] != "" {
		t.notes = append(t.notes, "snapshot.mode is not copied: resuming from Debezium's slot needs no snapshot (snapshot.mode: pending otherwise)")
	}
}
