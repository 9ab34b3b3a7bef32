package decode

// PayloadFormat is what the payload's source type says about its bytes; the
// router derives a content type from it (kafka.format cloudevents-*).
type PayloadFormat uint8

const (
	// PayloadText: the text form of a type other than json, jsonb and
	// bytea (text, varchar, xml, a domain, …). The zero value.
	PayloadText PayloadFormat = iota
	// PayloadJSON: json or jsonb, or the payload member of an emitted
	// message; always a valid JSON text.
	PayloadJSON
	// PayloadBinary: bytea, or payload_base64 of an emitted message.
	PayloadBinary
)

// PayloadFormatOf returns the format of a payload column of type typeOID.
func PayloadFormatOf(typeOID uint32) PayloadFormat {
	switch typeOID {
	case OIDJSON, OIDJSONB:
		return PayloadJSON
	case OIDBytea:
		return PayloadBinary
	}
	return PayloadText
}
