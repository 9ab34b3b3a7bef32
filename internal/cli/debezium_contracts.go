package cli

import (
	"fmt"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/contracts"
)

// registryConverters are the Debezium value converters that check and
// frame values with a schema registry, by the contracts.format they map to.
var registryConverters = map[string]contracts.Format{
	"io.confluent.connect.avro.AvroConverter":            contracts.FormatAvro,
	"io.confluent.connect.protobuf.ProtobufConverter":    contracts.FormatProtobuf,
	"io.confluent.connect.json.JsonSchemaConverter":      contracts.FormatJSONSchema,
	"io.apicurio.registry.utils.converter.AvroConverter": contracts.FormatAvro,
}

// subjectStrategies maps value.subject.name.strategy (Confluent's class
// names, with or without the package) to contracts.subject_strategy.
var subjectStrategies = map[string]contracts.Strategy{
	"TopicNameStrategy":       contracts.StrategyTopic,
	"RecordNameStrategy":      contracts.StrategyRecord,
	"TopicRecordNameStrategy": contracts.StrategyTopicRecord,
}

// contracts translates a schema registry value converter into contracts.*
// and notes what does not carry over; false when value.converter is not
// one (valueConverter then says what it does).
func (t *dbzTranslation) contracts() bool {
	vc := t.p["value.converter"]
	format, ok := registryConverters[vc]
	if !ok {
		return false
	}
	apicurio := strings.HasPrefix(vc, "io.apicurio.")
	url := t.conv("schema.registry.url")
	if apicurio { // its native API's URL: the Confluent API is beside it
		url = t.conv("apicurio.registry.url")
		if base, _, ok := strings.Cut(url, "/apis/registry"); ok {
			url = base + "/apis/ccompat/v7"
		}
	}
	first, rest, many := strings.Cut(url, ",")
	b := &t.b
	b.WriteString("contracts:\n  registry:\n")
	if first = strings.TrimSpace(first); first == "" {
		b.WriteString("    url: \"\"  # the registry's Confluent API base URL: value.converter's registry URL was not in the file\n")
	} else {
		fmt.Fprintf(b, "    url: %s\n", yamlQuote(first))
	}
	t.registrySecrets()
	if many {
		t.note("value.converter registry URLs %q: outbox-cdc uses one (%s); put the others behind one address", rest, first)
	}
	if apicurio {
		t.note("value.converter %s: outbox-cdc speaks the Confluent API (Apicurio's /apis/ccompat/v7) "+
			"and frames values with Confluent's 4-byte id in the value, not Apicurio's 8-byte id or id headers: consumers need Confluent-compatible deserializers", vc)
	}
	fmt.Fprintf(b, "  format: %s\n  mode: encode\n", format)
	if !format.Supported() {
		t.note("contracts.format %s is not yet supported by this version: the configuration is refused until it is", format)
	}
	t.subjectStrategy(vc)
	t.resolution()
	t.note("value.converter %s encoded a schema it inferred from the row (the payload column: a string, or with "+
		"table.expand.json.payload a record inferred from the JSON); outbox-cdc checks each payload against the schema "+
		"registered for its event type and encodes it with that schema: register them first (outbox-cdc contracts register "+
		"--schemas DIR), check the outbox with outbox-cdc contracts check, and give consumers the new reader schemas", vc)
	return true
}

// conv is a value.converter.<key> property.
func (t *dbzTranslation) conv(key string) string {
	return strings.TrimSpace(t.p["value.converter."+key])
}

func (t *dbzTranslation) note(format string, args ...any) {
	t.notes = append(t.notes, fmt.Sprintf(format, args...))
}

// subjectStrategy: Confluent's default is TopicNameStrategy; a record name
// becomes the event type.
func (t *dbzTranslation) subjectStrategy(vc string) {
	s := t.conv("value.subject.name.strategy")
	name := s[strings.LastIndex(s, ".")+1:]
	st, ok := subjectStrategies[name]
	switch {
	case s == "":
		st = contracts.StrategyTopic // the converters' default
	case !ok:
		t.note("value.converter.value.subject.name.strategy=%s has no equivalent: subject_strategy topic (<topic>-value) is used", s)
		st = contracts.StrategyTopic
	}
	fmt.Fprintf(&t.b, "  subject_strategy: %s\n", st)
	if st != contracts.StrategyTopic {
		t.note("value.subject.name.strategy %s named subjects after the record name %s inferred; outbox-cdc names them after the event_type column", name, vc)
	}
}

// resolution: auto.register.schemas (on by default) registered the
// inferred schema; there is none to register here, so schemas are looked
// up, and use.latest.version is what lookup does.
func (t *dbzTranslation) resolution() {
	b := &t.b
	b.WriteString("  resolution: lookup\n")
	if !strings.EqualFold(t.conv("auto.register.schemas"), "false") {
		t.note("value.converter.auto.register.schemas (on by default) registered the schema inferred from each row; " +
			"outbox-cdc infers none: resolution lookup uses the latest version registered under each subject")
	}
}

// registrySecrets: credentials inline in the properties cannot be copied;
// they become files.
func (t *dbzTranslation) registrySecrets() {
	if t.conv("basic.auth.user.info") != "" || t.conv("apicurio.auth.password") != "" {
		t.b.WriteString("    # username_file: /run/secrets/registry-username  # the user of basic.auth.user.info\n" +
			"    # password_file: /run/secrets/registry-password  # its password\n")
		t.note("value.converter's registry credentials are not copied: write the user and the password to two files " +
			"and set contracts.registry.username_file and password_file")
	}
	if t.conv("bearer.auth.token") != "" {
		t.note("value.converter.bearer.auth.token is not copied: write it to a file and set contracts.registry.token_file")
	}
	for k := range t.p {
		if strings.HasPrefix(k, "value.converter.schema.registry.ssl.") {
			t.note("value.converter.schema.registry.ssl.* (Java keystores) are not copied: give PEM files in contracts.registry.tls.*")
			break
		}
	}
}
