package contracts

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/sr"
)

// SchemaFile is a local schema to register: the file <subject>.json (JSON
// Schema), <subject>.avsc (Avro) or <subject>.proto (Protobuf).
type SchemaFile struct {
	Subject string
	Path    string
	Type    sr.SchemaType
	Text    string
}

// schemaExts maps a schema file's extension to its schema type.
var schemaExts = map[string]sr.SchemaType{".json": sr.TypeJSON, ".avsc": sr.TypeAvro, ".proto": sr.TypeProtobuf}

// ReadSchemaDir reads the schema files of dir, by subject; ignored are the
// other files' names. Two files naming one subject are an error.
func ReadSchemaDir(dir string) (files []SchemaFile, ignored []string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	seen := map[string]string{}
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		typ, ok := schemaExts[ext]
		subject := strings.TrimSuffix(e.Name(), ext)
		if !ok || e.IsDir() || subject == "" {
			ignored = append(ignored, e.Name())
			continue
		}
		if prev, dup := seen[subject]; dup {
			return nil, nil, fmt.Errorf("%s and %s both name subject %q", prev, e.Name(), subject)
		}
		seen[subject] = e.Name()
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, SchemaFile{Subject: subject, Path: path, Type: typ, Text: string(b)})
	}
	slices.SortFunc(files, func(a, b SchemaFile) int { return strings.Compare(a.Subject, b.Subject) })
	return files, ignored, nil
}

// Outcome is what registering a schema file did.
type Outcome string

// Outcomes.
const (
	// OutcomeRegistered: a new version (or a new subject) was registered.
	OutcomeRegistered Outcome = "registered"
	// OutcomeUnchanged: the subject already has this schema; nothing sent.
	OutcomeUnchanged Outcome = "unchanged"
	// OutcomeCompatible: a dry run found it registrable.
	OutcomeCompatible Outcome = "compatible"
	// OutcomeRefused: the registry refused it (incompatible under the
	// subject's level, or invalid), with its reasons.
	OutcomeRefused Outcome = "refused"
	// OutcomeFailed: the registry could not be asked.
	OutcomeFailed Outcome = "failed"
)

// Registration is one schema file's outcome.
type Registration struct {
	Subject string   `json:"subject"`
	File    string   `json:"file"`
	Type    string   `json:"schema_type"`
	Outcome Outcome  `json:"outcome"`
	New     bool     `json:"new_subject,omitempty"`
	Version int      `json:"version,omitempty"`
	ID      int      `json:"id,omitempty"`
	Reasons []string `json:"reasons,omitempty"` // the registry's words
}

// Failed reports whether the outcome is a refusal or a failure.
func (g Registration) Failed() bool { return g.Outcome == OutcomeRefused || g.Outcome == OutcomeFailed }

// RegisterFile registers f under its subject unless it is there already:
// a subject that has versions is first asked whether f is compatible with
// its latest under the subject's level (POST
// /compatibility/subjects/{s}/versions/latest), and an incompatible f is
// refused with the registry's reasons; a new subject is registered
// directly. With dryRun nothing is registered.
func (r *Registry) RegisterFile(ctx context.Context, f SchemaFile, dryRun bool) Registration {
	g := Registration{Subject: f.Subject, File: f.Path, Type: f.Type.String()}
	s := sr.Schema{Schema: f.Text, Type: f.Type}
	ss, err := r.cl.LookupSchema(ctx, f.Subject, s)
	switch {
	case err == nil:
		g.Outcome, g.Version, g.ID = OutcomeUnchanged, ss.Version, ss.ID
		return g
	case registryCode(err) == sr.ErrSubjectNotFound.Code:
		g.New = true
	case registryCode(err) != sr.ErrSchemaNotFound.Code:
		return r.refusal(g, f.Subject, err)
	}
	if !g.New {
		compat, err := r.cl.CheckCompatibility(sr.WithParams(ctx, sr.Verbose), f.Subject, -1, s)
		if err != nil {
			return r.refusal(g, f.Subject, err)
		}
		if !compat.Is {
			g.Outcome, g.Reasons = OutcomeRefused, compat.Messages
			if len(g.Reasons) == 0 { // Apicurio's answer has none, even verbose
				g.Reasons = []string{r.incompatible(ctx, f.Subject)}
			}
			r.observer().RegistryError(KindIncompatible)
			return g
		}
	}
	if dryRun {
		g.Outcome = OutcomeCompatible
		return g
	}
	if _, err := r.cl.RegisterSchema(ctx, f.Subject, s, -1, -1); err != nil {
		return r.refusal(g, f.Subject, err)
	}
	// Registering answers the id only; the lookup adds the version.
	if ss, err = r.cl.LookupSchema(ctx, f.Subject, s); err != nil {
		return r.refusal(g, f.Subject, err)
	}
	g.Outcome, g.Version, g.ID = OutcomeRegistered, ss.Version, ss.ID
	return g
}

// incompatible says what a compatibility answer without messages means:
// the level the registry checked, and its latest version.
func (r *Registry) incompatible(ctx context.Context, subject string) string {
	level := "the subject's compatibility level"
	if res := r.cl.Compatibility(sr.WithParams(ctx, sr.DefaultToGlobal), subject); len(res) == 1 && res[0].Err == nil {
		level = "compatibility level " + res[0].Level.String()
	}
	latest := "the latest version"
	if ss, err := r.cl.SchemaByVersion(ctx, subject, -1); err == nil {
		latest = fmt.Sprintf("version %d (id %d), the latest,", ss.Version, ss.ID)
	}
	return "the registry finds it incompatible with " + latest + " under " + level +
		" (it gave no details: compare the two, or ask the registry's own API)"
}

// refusal is g with err: refused when the registry judged the schema
// (incompatible, invalid), failed otherwise.
func (r *Registry) refusal(g Registration, subject string, err error) Registration {
	rerr := r.failed(classify(subject, err))
	g.Outcome = OutcomeFailed
	if errors.Is(rerr, ErrIncompatible) || errors.Is(rerr, ErrBadSchema) {
		g.Outcome = OutcomeRefused
	}
	g.Reasons = []string{rerr.Error()}
	return g
}

// registryCode is the Confluent API error code of err, 0 when it has none.
func registryCode(err error) int {
	var re *sr.ResponseError
	if errors.As(err, &re) {
		return re.ErrorCode
	}
	return 0
}
