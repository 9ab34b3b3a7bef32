package router

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/decode"
)

// Column placeholders name any column of the outbox table: {column:NAME}.
const columnPrefix = "{column:"

// columnOf returns NAME for a {column:NAME} placeholder, else "".
func columnOf(ph string) string {
	if !strings.HasPrefix(ph, columnPrefix) || !strings.HasSuffix(ph, "}") {
		return ""
	}
	return ph[len(columnPrefix) : len(ph)-1]
}

// templateColumns lists the columns a template's placeholders name.
func templateColumns(t string) []string {
	var out []string
	for _, ph := range placeholderRE.FindAllString(t, -1) {
		if c := columnOf(ph); c != "" {
			out = append(out, c)
		}
	}
	return out
}

// part is one piece of a general template: literal text, the aggregate type,
// or a column's value.
type part struct {
	lit    string
	column string // set for {column:NAME}
	agg    bool
}

// general is a topic template that needs more than a prefix and a suffix:
// column placeholders, or Debezium's regex replacement (RegexRouter: the
// whole name must match route.topic.regex, then route.topic.replacement).
type general struct {
	parts []part
	re    *regexp.Regexp // anchored; nil without kafka.topic_regex
	repl  string         // Go Expand syntax
	buf   []byte
}

func newGeneral(cfg Config) (*general, error) {
	g := &general{}
	t := cfg.TopicTemplate
	for {
		loc := placeholderRE.FindStringIndex(t)
		if loc == nil {
			break
		}
		if loc[0] > 0 {
			g.parts = append(g.parts, part{lit: t[:loc[0]]})
		}
		if ph := t[loc[0]:loc[1]]; ph == Placeholder {
			g.parts = append(g.parts, part{agg: true})
		} else {
			g.parts = append(g.parts, part{column: columnOf(ph)})
		}
		t = t[loc[1]:]
	}
	if t != "" {
		g.parts = append(g.parts, part{lit: t})
	}
	if cfg.TopicRegex == "" {
		return g, nil
	}
	re, err := regexp.Compile(`^(?:` + cfg.TopicRegex + `)$`)
	if err != nil {
		return nil, err
	}
	repl, err := javaReplacement(cfg.TopicReplacement, re.NumSubexp())
	if err != nil {
		return nil, err
	}
	g.re, g.repl = re, repl
	return g, nil
}

// name builds the topic name for ev before the regex: "" and a reason when a
// placeholder's value is NULL.
func (g *general) name(ev *decode.Event) (name []byte, reason string) {
	b := g.buf[:0]
	for _, p := range g.parts {
		switch {
		case p.agg:
			if ev.AggregateType.Null {
				return nil, "aggregate_type is NULL and kafka.topic uses " + Placeholder
			}
			b = append(b, ev.AggregateType.Bytes...)
		case p.column != "":
			v, _ := column(ev, p.column)
			if v.Null {
				return nil, fmt.Sprintf("column %q is NULL and kafka.topic uses %s%s}", p.column, columnPrefix, p.column)
			}
			b = append(b, v.Bytes...)
		default:
			b = append(b, p.lit...)
		}
	}
	g.buf = b
	return b, ""
}

// resolve applies the regex replacement to a built name and checks it.
func (g *general) resolve(name string) route {
	topic := name
	if g.re != nil {
		if m := g.re.FindStringSubmatchIndex(name); m != nil {
			topic = string(g.re.ExpandString(nil, g.repl, name, m))
		}
	}
	if reason := CheckTopic(topic); reason != "" {
		return route{reason: fmt.Sprintf("topic %q built from %q is not a legal Kafka topic name: %s", topic, name, reason)}
	}
	return route{topic: topic}
}

// javaReplacement turns a java.util.regex replacement ($1, ${name}, \$ for a
// literal) into regexp.Expand's syntax, following Matcher.appendReplacement:
// a group number takes further digits while it stays a valid group.
func javaReplacement(s string, groups int) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i == len(s) {
				return "", fmt.Errorf("character to be escaped is missing at the end of %q", s)
			}
			if s[i] == '$' {
				b.WriteString("$$")
			} else {
				b.WriteByte(s[i])
			}
		case c == '$':
			i++
			switch {
			case i < len(s) && s[i] == '{':
				end := strings.IndexByte(s[i:], '}')
				if end < 2 {
					return "", fmt.Errorf("named group reference in %q is not ${name}", s)
				}
				b.WriteString("${" + s[i+1:i+end] + "}")
				i += end
			case i < len(s) && s[i] >= '0' && s[i] <= '9':
				n := int(s[i] - '0')
				for i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' && n*10+int(s[i+1]-'0') <= groups {
					i++
					n = n*10 + int(s[i]-'0')
				}
				if n > groups {
					return "", fmt.Errorf("%q refers to group %d, the regex has %d", s, n, groups)
				}
				fmt.Fprintf(&b, "${%d}", n)
			default:
				return "", fmt.Errorf("illegal group reference in %q", s)
			}
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// column returns the value of extra column name in ev, and its type OID.
func column(ev *decode.Event, name string) (decode.Value, uint32) {
	for i := range ev.Columns {
		if ev.Columns[i].Name == name {
			return ev.Columns[i].Value, ev.Columns[i].Type
		}
	}
	return decode.Value{Null: true}, 0
}
