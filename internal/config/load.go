package config

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
)

// Load builds the configuration from the defaults, the YAML file at path (none
// if path is ""), and the OUTBOX_CDC_* variables in environ (os.Environ() in
// production), in that order, then validates it. On error the *Config is nil:
// an unreadable or non-YAML file is named (the error matches its cause, such
// as fs.ErrNotExist), other problems are reported all at once, as by Validate.
func Load(path string, environ []string) (*Config, error) {
	k := koanf.New(".")
	var problems []FieldError
	if path != "" {
		if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
			if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
				err = pe.Err // the path is already in front
			}
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
		problems = checkKeys("", k.Raw())
	}
	// The env provider cannot fail; it leaves out a variable given key "".
	_ = k.Load(env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, value string) (string, any) {
			l := leafByEnv[name]
			switch {
			case name == EnvConfigPath || strings.HasPrefix(name, envTestPrefix):
			case l == nil:
				fe := FieldError{Key: name, Problem: "unknown environment variable",
					Fix: "unset it; see the configuration reference for the variable names"}
				if s := suggest(name, envNames, "_"); s != "" {
					fe.Fix = "did you mean " + s + "?"
				}
				problems = append(problems, fe)
			default:
				v, fe := convert(l, value, name)
				if fe == nil {
					return l.key, v.Interface()
				}
				problems = append(problems, *fe)
			}
			return "", nil
		},
	}), nil)

	cfg, raw := Default(), k.Raw()
	for _, l := range leaves {
		if v, ok := lookup(raw, l.key); ok && v != nil { // null keeps the default
			if val, fe := convert(l, v, ""); fe != nil {
				problems = append(problems, *fe)
			} else {
				reflect.ValueOf(&cfg).Elem().FieldByIndex(l.index).Set(val)
			}
		}
	}
	implied(&cfg, raw)
	loaded := len(problems) // validation does not report these keys again
	for _, p := range cfg.problems() {
		parent, _, _ := strings.Cut(p.Key, "[") // kafka.brokers[1] → kafka.brokers
		if !slices.ContainsFunc(problems[:loaded], func(q FieldError) bool { return q.Key == p.Key || q.Key == parent }) {
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return nil, join(problems)
	}
	return &cfg, nil
}

// implied sets the defaults that depend on what else the file or the
// environment set.
func implied(cfg *Config, raw map[string]any) {
	if _, set := lookup(raw, "outbox.table"); !set && len(cfg.Outbox.Tables) > 0 {
		cfg.Outbox.Table = "" // the default names no table of the list
	}
	if b, set := lookup(raw, "kafka.latency_budget"); !set || b == nil {
		if l, fixed := lookup(raw, "kafka.linger"); fixed && l != nil {
			cfg.Kafka.LatencyBudget = 0 // a fixed linger replaces the default budget
		}
	}
}

// The schema is derived from the Config struct tags, so the known keys, their
// variable names and their types cannot drift from the struct.

// kind is a type of value as messages describe it: what it is, and how to
// write it in the file and in the environment (ENV stands for the variable).
type kind struct{ expected, howTo string }

var (
	kindString    = &kind{"a string", "write a plain string"}
	kindInt       = &kind{"an integer", "write an integer such as 1000 (environment: ENV=1000)"}
	kindDuration  = &kind{"a duration", "write a duration with a unit such as 500ms, 1s or 2m (environment: ENV=1s)"}
	kindStrings   = &kind{"a list", "write a list such as [a, b] (environment: a comma list, ENV=a,b)"}
	kindStringMap = &kind{"a mapping", "write a mapping such as {order: orders.v1} (environment: key=value pairs, ENV=order=orders.v1,user=users)"}
	kindBool      = &kind{"true or false", "write true or false (environment: ENV=true, false, 1 or 0)"}
)

// leaf is one settable key.
type leaf struct {
	key    string // dotted path: kafka.max_buffered_records
	env    string // OUTBOX_CDC_KAFKA_MAX_BUFFERED_RECORDS
	index  []int  // reflect field path from Config
	typ    reflect.Type
	kind   *kind
	secret bool // a DSN or a kafkaopt.Secret: its value is never shown
}

var (
	leaves    []*leaf // in struct order
	leafByKey = map[string]*leaf{}
	leafByEnv = map[string]*leaf{}
	envNames  []string                // in struct order, for suggestions
	allKeys   []string                // every leaf and section key, sorted, for suggestions
	sections  = map[string]bool{}     // the struct-valued keys (postgres, kafka.tls)
	children  = map[string][]string{} // section key ("" for the top level) → its keys, sorted
)

func init() {
	walkSchema(reflect.TypeFor[Config](), "", nil)
	for _, keys := range children {
		slices.Sort(keys)
	}
	slices.Sort(allKeys)
}

func walkSchema(t reflect.Type, prefix string, index []int) {
	kinds := map[reflect.Type]*kind{reflect.TypeFor[int](): kindInt, reflect.TypeFor[int64](): kindInt,
		reflect.TypeFor[time.Duration](): kindDuration, reflect.TypeFor[bool](): kindBool,
		reflect.TypeFor[[]string](): kindStrings, reflect.TypeFor[map[string]string](): kindStringMap,
		reflect.TypeFor[[]OutboxTable](): kindTables} // else kindString
	for i := range t.NumField() {
		f := t.Field(i)
		name := f.Tag.Get("koanf")
		key := strings.TrimPrefix(prefix+"."+name, ".")
		children[prefix], allKeys = append(children[prefix], name), append(allKeys, key)
		idx := append(slices.Clone(index), i)
		if f.Type.Kind() == reflect.Struct {
			sections[key] = true
			walkSchema(f.Type, key, idx)
			continue
		}
		l := &leaf{key: key, env: envName(key), index: idx, typ: f.Type, kind: cmp.Or(kinds[f.Type], kindString),
			secret: f.Type == reflect.TypeFor[DSN]() || f.Type == reflect.TypeFor[kafkaopt.Secret]()}
		leaves, envNames = append(leaves, l), append(envNames, l.env)
		leafByKey[key], leafByEnv[l.env] = l, l
	}
}

func envName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// checkKeys reports every key of the raw file map that is not in the schema,
// and every section that is not a mapping. Entries under a map-valued key
// (kafka.topics) are data, not keys.
func checkKeys(prefix string, m map[string]any) []FieldError {
	var out []FieldError
	for _, k := range slices.Sorted(maps.Keys(m)) {
		path := strings.TrimPrefix(prefix+"."+k, ".")
		v := m[k]
		switch sub, isMap := v.(map[string]any); {
		case leafByKey[path] != nil || sections[path] && v == nil:
		case sections[path] && isMap:
			out = append(out, checkKeys(path, sub)...)
		case sections[path]:
			got, _, _ := yamlValue(v)
			fe := FieldError{Key: path, Problem: "expected a section (mapping of keys), got " + got,
				Fix: "keys in " + path + " are: " + strings.Join(children[path], ", ")}
			// A section with a secret in it may be that secret written a level too high.
			if !slices.ContainsFunc(leaves, func(l *leaf) bool { return l.secret && strings.HasPrefix(l.key, path+".") }) {
				fe.Value = fmt.Sprint(v)
			}
			out = append(out, fe)
		default:
			fe := FieldError{Key: path, Problem: "unknown key", Fix: "top-level sections are: " + strings.Join(children[""], ", ")}
			if s := suggest(path, allKeys, "."); s != "" {
				fe.Fix = "did you mean " + s + "?"
			} else if prefix != "" {
				fe.Fix = "keys in " + prefix + " are: " + strings.Join(children[prefix], ", ")
			}
			out = append(out, fe)
		}
	}
	return out
}

// lookup finds a dotted key in the nested raw map. A file may also spell a
// key flat (log.level: … at the top level), which the YAML parser keeps as
// one key with a dot; that is found too, but the nested spelling, which is
// also where the environment puts its values, wins.
func lookup(m map[string]any, key string) (any, bool) {
	for i := range len(key) {
		if sub, ok := m[key[:i]].(map[string]any); key[i] == '.' && ok {
			if v, ok := lookup(sub, key[i+1:]); ok {
				return v, true
			}
		}
	}
	v, ok := m[key]
	return v, ok
}

// convert turns a value from the file, or the text of the environment
// variable env, into the leaf's type. The file's YAML values are checked
// strictly: a string where a list is expected is an error, not a
// one-element list. In the environment lists are comma lists and mappings
// key=value pairs.
func convert(l *leaf, v any, env string) (reflect.Value, *FieldError) {
	if reflect.TypeOf(v) == l.typ { // a YAML int or boolean, or a converted variable
		return reflect.ValueOf(v), nil
	}
	c := conversion{l: l, v: v, env: env}
	var out reflect.Value
	var fe *FieldError
	matched := true
	switch l.kind {
	case kindTables:
		return convertTables(l, v, env)
	case kindString:
		if _, str, scalar := yamlValue(v); scalar {
			return reflect.ValueOf(str).Convert(l.typ), nil
		}
		matched = false
	case kindInt:
		out, fe, matched = c.integer()
	case kindDuration:
		out, fe, matched = c.duration()
	case kindStrings:
		out, fe, matched = c.strings()
	case kindStringMap:
		out, fe, matched = c.stringMap()
	case kindBool:
		out, fe, matched = c.boolean()
	}
	if !matched {
		got, _, _ := yamlValue(v)
		return c.bad("expected " + l.kind.expected + ", got " + got)
	}
	return out, fe
}

// conversion is one value under conversion to its leaf's type. Each kind's
// method returns matched false for a value of another shape altogether,
// which convert reports as "expected ..., got ...".
type conversion struct {
	l   *leaf
	v   any
	env string // the variable the value came from, or ""
}

// fromEnv reports whether the value is an environment variable's text.
func (c conversion) fromEnv() (string, bool) {
	s, ok := c.v.(string)
	return s, ok && c.env != ""
}

func (c conversion) bad(problem string) (reflect.Value, *FieldError) {
	fe := &FieldError{Key: c.l.key, Problem: problem, Fix: strings.ReplaceAll(c.l.kind.howTo, "ENV", c.l.env)}
	if c.env != "" {
		fe.Problem = "invalid " + c.env + ": " + problem
	}
	if !c.l.secret {
		fe.Value = fmt.Sprint(c.v)
	}
	return reflect.Value{}, fe
}

// badItem is an item of a list or mapping that is not a plain string.
func (c conversion) badItem(key, what string, x any) (reflect.Value, *FieldError, bool) {
	got, _, _ := yamlValue(x)
	return reflect.Value{}, &FieldError{Key: key, Value: fmt.Sprint(x),
		Problem: "expected a string, got " + got, Fix: "each " + what + " of " + c.l.key + " is a plain string"}, true
}

func (c conversion) failed(problem string) (reflect.Value, *FieldError, bool) {
	v, fe := c.bad(problem)
	return v, fe, true
}

func (c conversion) integer() (reflect.Value, *FieldError, bool) {
	_, str, scalar := yamlValue(c.v)
	_, isString := c.v.(string)
	_, fromEnv := c.fromEnv()
	n, err := strconv.ParseInt(strings.TrimSpace(str), 10, 64)
	_, isBool := c.v.(bool)
	switch _, isFloat := c.v.(float64); {
	case !scalar || isBool || err != nil && isString && !fromEnv: // a quoted number is unambiguous; nothing else is
		return reflect.Value{}, nil, false
	case err != nil && fromEnv:
		return c.failed("not an integer")
	case err != nil && isFloat:
		return c.failed("not an integer, or out of range")
	case err != nil || c.l.typ.Kind() == reflect.Int && int64(int(n)) != n:
		return c.failed("out of range")
	}
	return reflect.ValueOf(n).Convert(c.l.typ), nil, true
}

func (c conversion) duration() (reflect.Value, *FieldError, bool) {
	switch x := c.v.(type) {
	case string:
		if d, err := time.ParseDuration(strings.TrimSpace(x)); err == nil {
			return reflect.ValueOf(d), nil, true
		}
		return c.failed("not a duration")
	case int, int64, uint64, float64:
		if x == 0 { // 0 needs no unit
			return reflect.ValueOf(time.Duration(0)), nil, true
		}
		return c.failed("a number without a unit is ambiguous")
	}
	return reflect.Value{}, nil, false
}

func (c conversion) strings() (reflect.Value, *FieldError, bool) {
	if s, ok := c.fromEnv(); ok {
		out := []string{}
		for item := range strings.SplitSeq(s, ",") {
			if strings.TrimSpace(s) != "" {
				out = append(out, strings.TrimSpace(item))
			}
		}
		return reflect.ValueOf(out), nil, true
	}
	list, ok := c.v.([]any)
	if !ok {
		return reflect.Value{}, nil, false
	}
	out := make([]string, 0, len(list))
	for i, x := range list {
		_, text, ok := yamlValue(x)
		if !ok {
			return c.badItem(fmt.Sprintf("%s[%d]", c.l.key, i), "item", x)
		}
		out = append(out, text)
	}
	return reflect.ValueOf(out), nil, true
}

func (c conversion) stringMap() (reflect.Value, *FieldError, bool) {
	if s, ok := c.fromEnv(); ok {
		out := map[string]string{}
		for item := range strings.SplitSeq(s, ",") {
			k, val, found := strings.Cut(item, "=")
			k = strings.TrimSpace(k)
			switch _, dup := out[k]; {
			case strings.TrimSpace(s) == "":
			case !found || k == "":
				return c.failed(fmt.Sprintf("entry %q is not key=value", strings.TrimSpace(item)))
			case dup:
				return c.failed(fmt.Sprintf("key %q is given twice", k))
			default:
				out[k] = strings.TrimSpace(val)
			}
		}
		return reflect.ValueOf(out), nil, true
	}
	m, ok := c.v.(map[string]any)
	if !ok {
		return reflect.Value{}, nil, false
	}
	out := make(map[string]string, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		_, text, ok := yamlValue(m[k])
		if !ok {
			return c.badItem(fmt.Sprintf("%s[%q]", c.l.key, k), "value", m[k])
		}
		out[k] = text
	}
	return reflect.ValueOf(out), nil, true
}

func (c conversion) boolean() (reflect.Value, *FieldError, bool) {
	s, isString := c.v.(string)
	if !isString { // quoted in the file: the same words as in the environment
		return reflect.Value{}, nil, false
	}
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true", "1":
		return reflect.ValueOf(true), nil, true
	case "false", "0":
		return reflect.ValueOf(false), nil, true
	}
	return c.failed("not true, false, 1 or 0")
}

// yamlValue names the type of a YAML value for messages and gives the text
// a scalar other than null was written as: where a string is expected, 9187
// and true are taken as that text (YAML has already parsed them).
func yamlValue(v any) (typeName, text string, scalar bool) {
	switch x := v.(type) {
	case nil:
		return "null", "", false
	case string:
		return "a string", x, true
	case int, int64, uint64:
		return "an integer", fmt.Sprint(x), true
	case float64:
		return "a number", strconv.FormatFloat(x, 'f', -1, 64), true
	case bool:
		return "a boolean", fmt.Sprint(x), true
	case []any:
		return "a list", "", false
	case map[string]any:
		return "a mapping", "", false
	case time.Time:
		return "a timestamp", "", false
	}
	return fmt.Sprintf("%T", v), "", false
}

// suggest returns the candidate closest to name, or "" if none is close. It
// also recognises a key written in the wrong section (dsn, kafka.dsn →
// postgres.dsn) by its last part, which follows the last sep.
func suggest(name string, candidates []string, sep string) string {
	lname := strings.ToLower(name)
	// A name that is exactly the last part of one key (dsn) means that key,
	// even when a short section name (dlq) is closer by edits.
	if m := lastPartMatch(lname, candidates, sep); m != "" {
		return m
	}
	best, bestD := "", math.MaxInt
	for _, c := range candidates {
		if d := editDistance(lname, strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	if bestD <= 2 || bestD == 3 && len(name) >= 12 {
		return best
	}
	return ""
}

// lastPartMatch is the one key, not a section, whose last part is the last
// part of lname; "" if none or several.
func lastPartMatch(lname string, candidates []string, sep string) string {
	last := lname[strings.LastIndex(lname, sep)+1:]
	var match string
	for _, c := range candidates {
		if strings.HasSuffix(strings.ToLower(c), sep+last) && !sections[c] {
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
	prev2, prev, cur := make([]int, len(rb)+1), make([]int, len(rb)+1), make([]int, len(rb)+1)
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
