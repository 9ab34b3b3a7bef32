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
	prefix := ""
	for _, name := range strings.Split(p["transforms"], ",") {
		if name = strings.TrimSpace(name); name != "" && p["transforms."+name+".type"] == eventRouterClass {
			prefix = "transforms." + name + "."
		}
	}
	if prefix == "" {
		return "", nil, fmt.Errorf("no transform of type %s in transforms", eventRouterClass)
	}
	opt := func(key, def string) string {
		if v, ok := p[prefix+key]; ok {
			return v
		}
		return def
	}
	var b strings.Builder
	q := func(s string) string { // a JSON string is a YAML scalar
		var j bytes.Buffer
		enc := json.NewEncoder(&j)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		return strings.TrimSuffix(j.String(), "\n")
	}

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
		fmt.Fprintf(&b, "  dsn: %s\n", q(dsn.String()))
	}
	if _, ok := p["database.password"]; ok {
		notes = append(notes, "database.password is not copied: set postgres.password_file or OUTBOX_CDC_POSTGRES_DSN")
	}
	for _, kv := range [][2]string{{"slot.name", "slot"}, {"publication.name", "publication"}} {
		if v := p[kv[0]]; v != "" {
			fmt.Fprintf(&b, "  %s: %s\n", kv[1], q(v))
		}
	}
	if ms := p["heartbeat.interval.ms"]; ms != "" {
		if n, err := strconv.Atoi(ms); err == nil && n > 0 {
			fmt.Fprintf(&b, "  heartbeat_interval: %s\n", time.Duration(n)*time.Millisecond)
		}
	}

	b.WriteString("outbox:\n")
	var tables []string
	for _, t := range strings.Split(p["table.include.list"], ",") {
		if t = strings.TrimSpace(t); t != "" {
			tables = append(tables, t)
		}
	}
	switch len(tables) {
	case 0:
		return "", nil, fmt.Errorf("table.include.list must name the outbox tables, it is %q", p["table.include.list"])
	case 1:
		fmt.Fprintf(&b, "  table: %s\n", q(tables[0]))
	default:
		// One EventRouter for every table: they share the mapping and the
		// routing below, which each entry of outbox.tables inherits.
		b.WriteString("  tables:\n")
		for _, t := range tables {
			fmt.Fprintf(&b, "    - table: %s\n", q(t))
		}
	}
	fmt.Fprintf(&b, "  columns:\n    id: %s\n    aggregate_id: %s\n    aggregate_type: %s\n    event_type: %s\n    payload: %s\n",
		q(opt("table.field.event.id", "id")), q(opt("table.field.event.key", "aggregateid")),
		q(opt("route.by.field", "aggregatetype")), q(opt("table.field.event.type", "type")),
		q(opt("table.field.event.payload", "payload")))
	b.WriteString("  standard_headers: [id]\n")
	if v := opt("table.fields.additional.placement", ""); v != "" {
		var fs []string
		for _, f := range strings.Split(v, ",") {
			fs = append(fs, q(strings.TrimSpace(f)))
		}
		fmt.Fprintf(&b, "  fields: [%s]\n", strings.Join(fs, ", "))
	}
	if v := opt("table.field.event.timestamp", ""); v != "" {
		fmt.Fprintf(&b, "  timestamp_column: %s\n", q(v))
	}
	if strings.EqualFold(opt("route.tombstone.on.empty.payload", "false"), "true") {
		b.WriteString("  tombstone_on_empty_payload: true\n")
	}

	b.WriteString("kafka:\n  brokers: []  # the Kafka Connect worker's bootstrap.servers\n")
	regex := opt("route.topic.regex", "(?<routedByValue>.*)")
	repl := opt("route.topic.replacement", "outbox.event.${routedByValue}")
	if regex == "(?<routedByValue>.*)" && !strings.ContainsAny(strings.ReplaceAll(repl, "${routedByValue}", ""), `$\{}`) {
		fmt.Fprintf(&b, "  topic: %s\n", q(strings.ReplaceAll(repl, "${routedByValue}", "{aggregate_type}")))
	} else {
		fmt.Fprintf(&b, "  topic: \"{aggregate_type}\"\n  topic_regex: %s\n  topic_replacement: %s\n", q(regex), q(repl))
	}
	if v := p["errors.deadletterqueue.topic.name"]; v != "" {
		fmt.Fprintf(&b, "  dlq_topic: %s\n", q(v))
	}

	for _, k := range []string{"table.expand.json.payload", "table.field.event.schema.version", "table.json.payload.null.behavior",
		"table.json.payload.empty.array.behavior", "tracing.span.context.field", "tracing.operation.name", "tracing.with.context.field.only"} {
		if v, ok := p[prefix+k]; ok && !(k == "table.expand.json.payload" && strings.EqualFold(v, "false")) {
			notes = append(notes, fmt.Sprintf("%s%s=%s has no equivalent (docs/operations.md)", prefix, k, v))
		}
	}
	if strings.EqualFold(opt("table.field.additional.missing", "error"), "ignore") {
		notes = append(notes, prefix+"table.field.additional.missing=ignore: outbox-cdc stops on a missing column instead")
	}
	switch vc := p["value.converter"]; vc {
	case "", "org.apache.kafka.connect.storage.StringConverter", "io.debezium.converters.BinaryDataConverter":
	case "org.apache.kafka.connect.json.JsonConverter":
		if !strings.EqualFold(p["value.converter.schemas.enable"], "false") {
			notes = append(notes, "value.converter JsonConverter with schemas: outbox-cdc writes the envelope without schemas")
		}
		if !strings.Contains(opt("table.fields.additional.placement", ""), ":envelope") {
			notes = append(notes, "value.converter JsonConverter without an envelope quotes the payload as a JSON string; outbox-cdc sends it as is")
		}
	default:
		notes = append(notes, "value.converter="+vc+" has no equivalent: values are the payload bytes or the JSON envelope")
	}
	if !strings.EqualFold(p["extended.headers.enabled"], "false") {
		// On by default in Debezium: every record carries them there.
		notes = append(notes, "extended.headers.enabled: Debezium's __debezium.context.* headers are not sent (docs/operations.md)")
	}
	if p["snapshot.mode"] != "" {
		notes = append(notes, "snapshot.mode is not copied: resuming from Debezium's slot needs no snapshot (snapshot.mode: pending otherwise)")
	}
	return b.String(), notes, nil
}
