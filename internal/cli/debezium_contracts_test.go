package cli

import (
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/contracts"
)

// TestFromDebeziumContracts: a schema registry value converter becomes
// contracts.*, and what does not carry over is said.
func TestFromDebeziumContracts(t *testing.T) {
	base := "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" +
		"table.include.list=public.outbox\nextended.headers.enabled=false\n"
	conf := "value.converter.schema.registry.url=http://sr:8081\n"
	for _, tc := range []struct {
		name      string
		props     string
		format    contracts.Format
		wantYAML  []string
		wantNotes []string
		noNotes   []string
	}{
		{name: "json schema, defaults", format: contracts.FormatJSONSchema,
			props:     "value.converter=io.confluent.connect.json.JsonSchemaConverter\n" + conf,
			wantYAML:  []string{"contracts:\n  registry:\n    url: \"http://sr:8081\"\n", "  format: json-schema\n  mode: encode\n", "  subject_strategy: topic\n", "  resolution: lookup\n"},
			wantNotes: []string{"auto.register.schemas (on by default)", "inferred from the row", "contracts register"},
			noNotes:   []string{"has no equivalent: values are"}},
		{name: "avro, record strategy, no auto register, secrets", format: contracts.FormatAvro,
			props: "value.converter=io.confluent.connect.avro.AvroConverter\n" + conf +
				"value.converter.auto.register.schemas=false\nvalue.converter.use.latest.version=true\n" +
				"value.converter.value.subject.name.strategy=io.confluent.kafka.serializers.subject.RecordNameStrategy\n" +
				"value.converter.basic.auth.credentials.source=USER_INFO\nvalue.converter.basic.auth.user.info=u:p\n" +
				"value.converter.schema.registry.ssl.truststore.location=/ts.jks\n",
			wantYAML:  []string{"  format: avro\n", "  subject_strategy: record\n", "# username_file:"},
			wantNotes: []string{"named subjects after the record name", "credentials are not copied", "Java keystores"},
			noNotes:   []string{"auto.register.schemas (on by default)", "u:p"}},
		{name: "protobuf, topic record", format: contracts.FormatProtobuf,
			props: "value.converter=io.confluent.connect.protobuf.ProtobufConverter\n" + conf +
				"value.converter.value.subject.name.strategy=TopicRecordNameStrategy\nvalue.converter.bearer.auth.token=tok\n",
			wantYAML:  []string{"  format: protobuf\n", "  subject_strategy: topic_record\n"},
			wantNotes: []string{"token_file"}, noNotes: []string{"tok\n"}},
		{name: "apicurio", format: contracts.FormatAvro,
			props: "value.converter=io.apicurio.registry.utils.converter.AvroConverter\n" +
				"value.converter.apicurio.registry.url=http://apicurio:8080/apis/registry/v2\n",
			wantYAML:  []string{`url: "http://apicurio:8080/apis/ccompat/v7"`},
			wantNotes: []string{"8-byte id"}},
		{name: "several URLs, unknown strategy", format: contracts.FormatJSONSchema,
			props: "value.converter=io.confluent.connect.json.JsonSchemaConverter\n" +
				"value.converter.schema.registry.url=http://a:8081, http://b:8081\nvalue.converter.value.subject.name.strategy=com.x.Mine\n",
			wantYAML:  []string{`url: "http://a:8081"`, "subject_strategy: topic\n"},
			wantNotes: []string{"outbox-cdc uses one (http://a:8081)", "com.x.Mine has no equivalent"}},
		{name: "no URL", format: contracts.FormatJSONSchema,
			props:    "value.converter=io.confluent.connect.json.JsonSchemaConverter\n",
			wantYAML: []string{`url: ""  # the registry's`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := readProperties(strings.NewReader(base + tc.props))
			if err != nil {
				t.Fatal(err)
			}
			yaml, notes, err := fromDebezium(p)
			if err != nil {
				t.Fatal(err)
			}
			all := strings.Join(notes, "\n")
			for _, w := range tc.wantYAML {
				if !strings.Contains(yaml, w) {
					t.Errorf("YAML lacks %q:\n%s", w, yaml)
				}
			}
			for _, w := range tc.wantNotes {
				if !strings.Contains(all, w) {
					t.Errorf("notes lack %q:\n%s", w, all)
				}
			}
			for _, w := range tc.noNotes {
				if strings.Contains(all+yaml, w) {
					t.Errorf("output has %q:\n%s\n%s", w, yaml, all)
				}
			}
			switch {
			case strings.Contains(yaml, `url: ""`):
			case tc.format.Supported():
				loadYAML(t, yaml) // a valid configuration
			case !strings.Contains(all, "not yet supported"):
				t.Errorf("format %s unsupported here, and the notes do not say so:\n%s", tc.format, all)
			}
		})
	}
}
