package decode

// Built-in type OIDs (PostgreSQL's pg_type.dat) that decide how a column's
// text is read: the payload's format here, header and envelope values and
// the timestamp column in the router. The decoder converts only bytea (its
// hex text to the raw bytes); every other value, json/jsonb/text/uuid,
// timestamps and integers included, is passed on in the text form
// PostgreSQL sent.
const (
	OIDBool        = 16
	OIDBytea       = 17
	OIDInt8        = 20
	OIDInt2        = 21
	OIDInt4        = 23
	OIDJSON        = 114
	OIDFloat4      = 700
	OIDFloat8      = 701
	OIDTimestamp   = 1114
	OIDTimestamptz = 1184
	OIDJSONB       = 3802
)
