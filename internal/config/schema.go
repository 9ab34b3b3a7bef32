package config

import (
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	yamlv3 "go.yaml.in/yaml/v3"
)

// The schema is derived once from the Config struct tags, so that the set of
// known keys, their environment variable names and their types cannot drift
// from the struct.

type kind int

const (
	kindString kind = iota
	kindInt
	kindDuration
	kindStrings   // []string
	kindStringMap // map[string]string
	kindBool
)

// leaf is one settable key.
type leaf struct {
	key   string // dotted path: kafka.max_buffered_records
	env   string // OUTBOX_CDC_KAFKA_MAX_BUFFERED_RECORDS
	index []int  // reflect field path from Config
	typ   reflect.Type
	kind  kind
}

var (
	leaves     []leaf           // in struct order
	leafByKey  map[string]*leaf // dotted key → leaf
	leafByEnv  map[string]*leaf // env name → leaf
	sectionSet map[string]bool  // dotted paths of struct-valued keys
	envNames   []string         // every known env name, for suggestions
	allKeys    []string         // every leaf and section key, for suggestions
	schemaTree *node            // leaves arranged by section
)

func init() {
	leafByKey = map[string]*leaf{}
	leafByEnv = map[string]*leaf{}
	sectionSet = map[string]bool{}
	walkSchema(reflect.TypeFor[Config](), "", nil)
	for i := range leaves {
		l := &leaves[i]
		if leafByKey[l.key] != nil || leafByEnv[l.env] != nil {
			panic("config: duplicate key or env name " + l.key)
		}
		if l.env == EnvConfigPath || strings.HasPrefix(l.env, envTestPrefix) {
			panic("config: key " + l.key + " collides with a reserved variable")
		}
		leafByKey[l.key] = l
		leafByEnv[l.env] = l
		envNames = append(envNames, l.env)
		allKeys = append(allKeys, l.key)
	}
	for s := range sectionSet {
		allKeys = append(allKeys, s)
	}
	sort.Strings(allKeys)
	schemaTree = buildTree()
}

func walkSchema(t reflect.Type, prefix string, index []int) {
	for i := range t.NumField() {
		f := t.Field(i)
		name := f.Tag.Get("koanf")
		if name == "" || name == "-" {
			continue
		}
		key := name
		if prefix != "" {
			key = prefix + "." + name
		}
		idx := append(append([]int(nil), index...), i)
		var k kind
		switch {
		case f.Type == reflect.TypeFor[time.Duration]():
			k = kindDuration
		case f.Type.Kind() == reflect.Struct:
			sectionSet[key] = true
			walkSchema(f.Type, key, idx)
			continue
		case f.Type.Kind() == reflect.String:
			k = kindString
		case f.Type.Kind() == reflect.Bool:
			k = kindBool
		case f.Type.Kind() == reflect.Int || f.Type.Kind() == reflect.Int64:
			k = kindInt
		case f.Type == reflect.TypeFor[[]string]():
			k = kindStrings
		case f.Type == reflect.TypeFor[map[string]string]():
			k = kindStringMap
		default:
			panic("config: unsupported field type " + f.Type.String() + " for " + key)
		}
		leaves = append(leaves, leaf{key: key, env: envName(key), index: idx, typ: f.Type, kind: k})
	}
}

func envName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// expected names the accepted form of a kind, for error messages.
func (k kind) expected() string {
	switch k {
	case kindInt:
		return "an integer"
	case kindDuration:
		return "a duration"
	case kindStrings:
		return "a list"
	case kindStringMap:
		return "a mapping"
	case kindBool:
		return "true or false"
	default:
		return "a string"
	}
}

// howTo says how to write a kind in the file and in the environment.
func (l *leaf) howTo() string {
	switch l.kind {
	case kindInt:
		return "write an integer such as 1000 (environment: " + l.env + "=1000)"
	case kindDuration:
		return "write a duration with a unit such as 500ms, 1s or 2m (environment: " + l.env + "=1s)"
	case kindStrings:
		return "write a list such as [a, b] (environment: a comma list, " + l.env + "=a,b)"
	case kindStringMap:
		return "write a mapping such as {order: orders.v1} (environment: key=value pairs, " + l.env + "=order=orders.v1,user=users)"
	case kindBool:
		return "write true or false (environment: " + l.env + "=true, false, 1 or 0)"
	default:
		return "write a plain string"
	}
}

// checkKeys reports every key of the raw file map that is not in the schema,
// and every section that is not a mapping. Entries under a map-valued key
// (kafka.topics) are data, not keys.
func checkKeys(prefix string, m map[string]any) []FieldError {
	var out []FieldError
	for _, k := range sortedKeys(m) {
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		v := m[k]
		switch {
		case leafByKey[path] != nil:
		case sectionSet[path]:
			if sub, ok := v.(map[string]any); ok {
				out = append(out, checkKeys(path, sub)...)
			} else if v != nil {
				shown := fmt.Sprint(v)
				if holdsSecret(path) {
					shown = "" // may be a secret written one level too high
				}
				out = append(out, FieldError{
					Key: path, Value: shown,
					Problem: "expected a section (mapping of keys), got " + typeName(v),
					Fix:     "keys in " + path + " are: " + strings.Join(childKeys(path), ", "),
				})
			}
		default:
			fe := FieldError{Key: path, Problem: "unknown key"}
			if s := suggest(path, allKeys); s != "" {
				fe.Fix = "did you mean " + s + "?"
			} else if prefix != "" {
				fe.Fix = "keys in " + prefix + " are: " + strings.Join(childKeys(prefix), ", ")
			} else {
				fe.Fix = "top-level sections are: " + strings.Join(childKeys(""), ", ")
			}
			out = append(out, fe)
		}
	}
	return out
}

// childKeys lists the direct children of a section.
func childKeys(section string) []string {
	var out []string
	seen := map[string]bool{}
	for _, k := range allKeys {
		rest, ok := k, section == ""
		if !ok {
			rest, ok = strings.CutPrefix(k, section+".")
		}
		if !ok || rest == "" {
			continue
		}
		child, _, _ := strings.Cut(rest, ".")
		if !seen[child] {
			seen[child] = true
			out = append(out, child)
		}
	}
	return out
}

// fromEnv maps one environment variable to a key and a typed value. It
// returns key "" for variables to skip (reserved, unknown or invalid), with a
// FieldError for the unknown and invalid ones.
func fromEnv(name, value string) (string, any, *FieldError) {
	if name == EnvConfigPath || strings.HasPrefix(name, envTestPrefix) {
		return "", nil, nil
	}
	l := leafByEnv[name]
	if l == nil {
		fe := &FieldError{Key: name, Problem: "unknown environment variable"}
		if s := suggest(name, envNames); s != "" {
			fe.Fix = "did you mean " + s + "?"
		} else {
			fe.Fix = "unset it; see the configuration reference for the variable names"
		}
		return "", nil, fe
	}
	v, err := parseEnvValue(l.kind, value)
	if err != nil {
		shown := value
		if l.key == "postgres.dsn" {
			shown = RedactDSN(value)
		} else if holdsSecret(l.key) {
			shown = ""
		}
		return "", nil, &FieldError{
			Key: l.key, Value: shown,
			Problem: "invalid " + name + ": " + err.Error(),
			Fix:     l.howTo(),
		}
	}
	return l.key, v, nil
}

func parseEnvValue(k kind, s string) (any, error) {
	switch k {
	case kindInt:
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("not an integer")
		}
		return n, nil
	case kindDuration:
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("not a duration")
		}
		return d, nil
	case kindStrings:
		out := []string{}
		if strings.TrimSpace(s) == "" {
			return out, nil
		}
		for item := range strings.SplitSeq(s, ",") {
			out = append(out, strings.TrimSpace(item))
		}
		return out, nil
	case kindBool:
		b, ok := parseBool(s)
		if !ok {
			return nil, fmt.Errorf("not true, false, 1 or 0")
		}
		return b, nil
	case kindStringMap:
		out := map[string]string{}
		if strings.TrimSpace(s) == "" {
			return out, nil
		}
		for item := range strings.SplitSeq(s, ",") {
			k, v, ok := strings.Cut(item, "=")
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if !ok || k == "" {
				return nil, fmt.Errorf("entry %q is not key=value", strings.TrimSpace(item))
			}
			if _, dup := out[k]; dup {
				return nil, fmt.Errorf("key %q is given twice", k)
			}
			out[k] = v
		}
		return out, nil
	default:
		return s, nil
	}
}

// decode sets every leaf present in raw onto cfg, which holds the defaults.
// A null value keeps the default. Values from the environment arrive already
// typed (int64, time.Duration, []string, map[string]string); values from the
// file are YAML scalars, sequences and mappings and are checked strictly: a
// string where a list is expected is an error, not a one-element list.
func decode(raw map[string]any, cfg *Config) []FieldError {
	var out []FieldError
	root := reflect.ValueOf(cfg).Elem()
	for i := range leaves {
		l := &leaves[i]
		v, ok := lookup(raw, l.key)
		if !ok || v == nil {
			continue
		}
		val, fe := convert(l, v)
		if fe != nil {
			out = append(out, *fe)
			continue
		}
		root.FieldByIndex(l.index).Set(val)
	}
	return out
}

// lookup finds a dotted key in the nested raw map. A file may also spell a
// key flat (log.level: … at the top level), which the YAML parser keeps as
// one key with a dot; that is found too, but the nested spelling, which is
// also where the environment puts its values, wins.
func lookup(m map[string]any, key string) (any, bool) {
	for i := range len(key) {
		if key[i] != '.' {
			continue
		}
		if sub, ok := m[key[:i]].(map[string]any); ok {
			if v, ok := lookup(sub, key[i+1:]); ok {
				return v, true
			}
		}
	}
	v, ok := m[key]
	return v, ok
}

func convert(l *leaf, v any) (reflect.Value, *FieldError) {
	bad := func(problem string) (reflect.Value, *FieldError) {
		shown := fmt.Sprint(v)
		if l.key == "postgres.dsn" || holdsSecret(l.key) {
			shown = "" // not a string, so RedactDSN cannot be trusted with it
		}
		return reflect.Value{}, &FieldError{
			Key: l.key, Value: shown, Problem: problem,
			Fix: l.howTo(),
		}
	}
	wrongType := func() (reflect.Value, *FieldError) {
		return bad("expected " + l.kind.expected() + ", got " + typeName(v))
	}
	switch l.kind {
	case kindString:
		s, ok := scalarString(v)
		if !ok {
			return wrongType()
		}
		return reflect.ValueOf(s), nil
	case kindInt:
		var n int64
		switch x := v.(type) {
		case int:
			n = int64(x)
		case int64:
			n = x
		case uint64:
			if x > math.MaxInt64 {
				return bad("out of range")
			}
			n = int64(x)
		case float64:
			if x != math.Trunc(x) || x < math.MinInt64 || x >= math.MaxInt64 {
				return bad("not an integer, or out of range")
			}
			n = int64(x)
		case string: // a quoted number is unambiguous; anything else is not
			p, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
			if err != nil {
				return wrongType()
			}
			n = p
		default:
			return wrongType()
		}
		if l.typ.Kind() == reflect.Int && int64(int(n)) != n {
			return bad("out of range")
		}
		return reflect.ValueOf(n).Convert(l.typ), nil
	case kindDuration:
		switch x := v.(type) {
		case time.Duration:
			return reflect.ValueOf(x), nil
		case string:
			d, err := time.ParseDuration(strings.TrimSpace(x))
			if err != nil {
				return bad("not a duration")
			}
			return reflect.ValueOf(d), nil
		case int:
			if x == 0 { // 0 needs no unit
				return reflect.ValueOf(time.Duration(0)), nil
			}
			return bad("a number without a unit is ambiguous")
		case int64, uint64, float64:
			return bad("a number without a unit is ambiguous")
		default:
			return wrongType()
		}
	case kindStrings:
		switch x := v.(type) {
		case []string:
			return reflect.ValueOf(append([]string{}, x...)), nil
		case []any:
			out := make([]string, 0, len(x))
			for i, item := range x {
				s, ok := scalarString(item)
				if !ok || item == nil {
					return reflect.Value{}, &FieldError{
						Key: fmt.Sprintf("%s[%d]", l.key, i), Value: fmt.Sprint(item),
						Problem: "expected a string, got " + typeName(item),
						Fix:     "each item of " + l.key + " is a plain string",
					}
				}
				out = append(out, s)
			}
			return reflect.ValueOf(out), nil
		default:
			return wrongType()
		}
	case kindBool:
		switch x := v.(type) {
		case bool:
			return reflect.ValueOf(x), nil
		case string: // quoted, or from the environment: the same words as there
			if b, ok := parseBool(x); ok {
				return reflect.ValueOf(b), nil
			}
			return bad("not true, false, 1 or 0")
		default:
			return wrongType()
		}
	case kindStringMap:
		switch x := v.(type) {
		case map[string]string:
			out := make(map[string]string, len(x))
			for k, s := range x {
				out[k] = s
			}
			return reflect.ValueOf(out), nil
		case map[string]any:
			out := make(map[string]string, len(x))
			for _, k := range sortedKeys(x) {
				s, ok := scalarString(x[k])
				if !ok || x[k] == nil {
					return reflect.Value{}, &FieldError{
						Key: fmt.Sprintf("%s[%q]", l.key, k), Value: fmt.Sprint(x[k]),
						Problem: "expected a string, got " + typeName(x[k]),
						Fix:     "each value of " + l.key + " is a plain string",
					}
				}
				out[k] = s
			}
			return reflect.ValueOf(out), nil
		default:
			return wrongType()
		}
	}
	return wrongType()
}

// parseBool accepts the spellings of a boolean allowed in the environment:
// true, false, 1 and 0 (any case, surrounding space ignored).
func parseBool(s string) (value, ok bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true", "1":
		return true, true
	case "false", "0":
		return false, true
	}
	return false, false
}

// scalarString accepts a YAML scalar as a string: 9187 and true are taken as
// the text they were written as (YAML has already parsed them).
func scalarString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case int, int64, uint64, bool:
		return fmt.Sprint(x), true
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), true
	case nil:
		return "", true
	}
	return "", false
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case int, int64, uint64:
		return "an integer"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	case []any, []string:
		return "a list"
	case map[string]any, map[string]string:
		return "a mapping"
	case time.Time:
		return "a timestamp"
	}
	return fmt.Sprintf("%T", v)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// suggest returns the candidate closest to name, or "" if none is close. It
// also recognises a key written in the wrong section (dsn, kafka.dsn →
// postgres.dsn) by its last part.
func suggest(name string, candidates []string) string {
	lname := strings.ToLower(name)
	best, bestD := "", math.MaxInt
	for _, c := range candidates {
		if d := editDistance(lname, strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	limit := 2
	if len(name) >= 12 {
		limit = 3
	}
	if bestD <= limit {
		return best
	}
	sep := "."
	if strings.HasPrefix(name, EnvPrefix) {
		sep = "_"
	}
	last := lname[strings.LastIndex(lname, sep)+1:]
	var match string
	for _, c := range candidates {
		lc := strings.ToLower(c)
		if strings.HasSuffix(lc, sep+last) && !sectionSet[c] {
			if match != "" {
				return "" // ambiguous
			}
			match = c
		}
	}
	return match
}

// editDistance is the optimal string alignment distance: insertions,
// deletions, substitutions and transpositions of neighbours cost 1.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}

// node is a section or a leaf of the schema tree, in struct order.
type node struct {
	name     string
	leaf     *leaf // nil for a section
	children []*node
}

// buildTree arranges the leaves by section, in struct order.
func buildTree() *node {
	root := &node{}
	for i := range leaves {
		l := &leaves[i]
		parts := strings.Split(l.key, ".")
		n := root
		for _, part := range parts[:len(parts)-1] {
			var next *node
			for _, c := range n.children {
				if c.name == part && c.leaf == nil {
					next = c
				}
			}
			if next == nil {
				next = &node{name: part}
				n.children = append(n.children, next)
			}
			n = next
		}
		n.children = append(n.children, &node{name: parts[len(parts)-1], leaf: l})
	}
	return root
}

// display returns the value of a leaf as it is shown to people: durations as
// text (1s), the DSN's password and every secret key redacted, everything
// else as is.
func display(cfg *Config, l *leaf) any {
	v := reflect.ValueOf(cfg).Elem().FieldByIndex(l.index).Interface()
	switch x := v.(type) {
	case time.Duration:
		return x.String()
	case string:
		if l.key == "postgres.dsn" {
			return RedactDSN(x)
		}
		if secretKeys[l.key] && x != "" {
			return redacted
		}
	}
	return v
}

// section returns the node of a section key (kafka, kafka.sasl), or nil.
func section(path string) *node {
	n := schemaTree
	for part := range strings.SplitSeq(path, ".") {
		var next *node
		for _, c := range n.children {
			if c.name == part && c.leaf == nil {
				next = c
			}
		}
		if next == nil {
			return nil
		}
		n = next
	}
	return n
}

// renderFlow writes one section of cfg as a single-line YAML mapping in
// schema order, secrets redacted.
func renderFlow(cfg *Config, n *node) string {
	root := yamlNode(cfg, n)
	var setFlow func(*yamlv3.Node)
	setFlow = func(x *yamlv3.Node) {
		if x.Kind == yamlv3.MappingNode || x.Kind == yamlv3.SequenceNode {
			x.Style = yamlv3.FlowStyle
		}
		for _, c := range x.Content {
			setFlow(c)
		}
	}
	setFlow(root)
	out, err := yamlv3.Marshal(root)
	if err != nil {
		return fmt.Sprintf("config: cannot render: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// render writes cfg as YAML in schema order with the DSN redacted.
func render(cfg *Config) string {
	var b strings.Builder
	enc := yamlv3.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(yamlNode(cfg, schemaTree)); err != nil {
		return fmt.Sprintf("config: cannot render: %v", err)
	}
	_ = enc.Close()
	return b.String()
}

// yamlNode converts a section (or leaf) of cfg to a YAML node in schema
// order; lists and maps of values are in flow style.
func yamlNode(cfg *Config, n *node) *yamlv3.Node {
	if n.leaf != nil {
		v := display(cfg, n.leaf)
		out := &yamlv3.Node{}
		if err := out.Encode(v); err != nil {
			return &yamlv3.Node{Kind: yamlv3.ScalarNode, Value: fmt.Sprint(v)}
		}
		if out.Kind == yamlv3.SequenceNode || out.Kind == yamlv3.MappingNode {
			out.Style = yamlv3.FlowStyle
		}
		return out
	}
	m := &yamlv3.Node{Kind: yamlv3.MappingNode}
	for _, c := range n.children {
		m.Content = append(m.Content, &yamlv3.Node{Kind: yamlv3.ScalarNode, Value: c.name}, yamlNode(cfg, c))
	}
	return m
}

// asMap returns cfg as nested maps keyed by the configuration keys, for JSON.
func asMap(cfg *Config, n *node) map[string]any {
	out := make(map[string]any, len(n.children))
	for _, c := range n.children {
		if c.leaf != nil {
			out[c.name] = display(cfg, c.leaf)
		} else {
			out[c.name] = asMap(cfg, c)
		}
	}
	return out
}

// logAttrs returns cfg as slog groups keyed by the configuration keys.
func logAttrs(cfg *Config, n *node) []slog.Attr {
	out := make([]slog.Attr, 0, len(n.children))
	for _, c := range n.children {
		if c.leaf != nil {
			out = append(out, slog.Any(c.name, display(cfg, c.leaf)))
		} else {
			out = append(out, slog.Attr{Key: c.name, Value: slog.GroupValue(logAttrs(cfg, c)...)})
		}
	}
	return out
}
