package config

import (
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/router"
)

// TestCloudEventsKeys: kafka.format and kafka.cloudevents.* have their
// defaults, load from the file and the environment, and each bad value is
// a FieldError naming its key.
func TestCloudEventsKeys(t *testing.T) {
	t.Parallel()
	c, err := Load("", requiredEnv)
	if err != nil {
		t.Fatal(err)
	}
	if c.Kafka.Format != "plain" || c.Kafka.CloudEvents != (KafkaCloudEvents{Source: "/outbox-cdc/{database}/{schema}.{table}"}) {
		t.Errorf("defaults: format %q, cloudevents %+v", c.Kafka.Format, c.Kafka.CloudEvents)
	}

	file := writeFile(t, withRequiredYAML(t, "kafka:\n  format: cloudevents-structured\n  cloudevents: {source: 'urn:shop:{table}'}\n"))
	c, err = Load(file, append(requiredEnv[:len(requiredEnv):len(requiredEnv)], "OUTBOX_CDC_KAFKA_CLOUDEVENTS_CONTENT_TYPE=application/vnd.shop+json"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Kafka.Format != router.FormatCEStructured || c.Kafka.CloudEvents.Source != "urn:shop:{table}" ||
		c.Kafka.CloudEvents.ContentType != "application/vnd.shop+json" {
		t.Errorf("loaded %q %+v", c.Kafka.Format, c.Kafka.CloudEvents)
	}

	tests := []struct {
		name string
		mod  func(*Kafka)
		want string // the error line
	}{
		{"unknown format", func(k *Kafka) { k.Format = "cloudevents" },
			`kafka.format = "cloudevents": not supported; use one of plain, cloudevents-binary, cloudevents-structured`},
		{"unknown placeholder", func(k *Kafka) { k.Format, k.CloudEvents.Source = router.FormatCEBinary, "/x/{slot}" },
			`kafka.cloudevents.source = "/x/{slot}": unknown placeholder {slot}; use a URI reference such as /outbox-cdc/{database}/{schema}.{table}; placeholders: {database}, {schema}, {table}`},
		{"content type without a cloudevents format", func(k *Kafka) { k.CloudEvents.ContentType = "text/plain" },
			`kafka.cloudevents.content_type = "text/plain": set while kafka.format is plain, which does not use it; set kafka.format to cloudevents-binary or cloudevents-structured, or remove the key`},
		{"content type not a media type", func(k *Kafka) { k.Format, k.CloudEvents.ContentType = router.FormatCEBinary, "json" },
			`kafka.cloudevents.content_type = "json": not a media type (type/subtype)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := withRequired()
			tc.mod(&c.Kafka)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v\nwant %s", err, tc.want)
			}
		})
	}
}
