package contracts

import (
	"strconv"
	"strings"
)

// MediaType is the CloudEvents datacontenttype of a record value under a
// contract of format f in mode m: the media type of the data's body.
//   - validate: the value is the JSON payload, checked: application/json,
//     whatever the format.
//   - encode: the body after the 5-byte wire header is the format's
//     encoding: application/json (a JSON Schema body is the payload's
//     bytes), application/avro (Avro binary; Avro's own HTTP transport
//     says avro/binary, which is not a registered top-level type, and the
//     registries' tooling says application/avro), application/protobuf
//     (the name the CloudEvents Protobuf format and the IETF draft for
//     Protobuf media types use). The header's id is the one dataschema
//     names, so a consumer with a registry deserializer reads it either way.
func MediaType(f Format, m Mode) string {
	if m != ModeEncode {
		return "application/json"
	}
	switch f {
	case FormatAvro:
		return "application/avro"
	case FormatProtobuf:
		return "application/protobuf"
	}
	return "application/json"
}

// SchemaURL is the URL of the schema with id in the registry at base (the
// Confluent API's base URL): GET on it answers the schema, the CloudEvents
// dataschema of the events checked against it.
func SchemaURL(base string, id int) string {
	return strings.TrimRight(base, "/") + "/schemas/ids/" + strconv.Itoa(id)
}
