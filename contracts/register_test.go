package contracts

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestReadSchemaDir(t *testing.T) {
	t.Parallel()
	dir := writeFiles(t, map[string]string{"orders-OrderPlaced.json": "{}", "Payment.avsc": `{"type":"string"}`,
		"inv-value.proto": `syntax = "proto3";`, "README.md": "x", ".json": "{}"})
	if err := os.Mkdir(filepath.Join(dir, "sub.json"), 0o700); err != nil {
		t.Fatal(err)
	}
	files, ignored, err := ReadSchemaDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range files {
		got = append(got, f.Subject+":"+f.Type.String())
	}
	if want := []string{"Payment:AVRO", "inv-value:PROTOBUF", "orders-OrderPlaced:JSON"}; !slices.Equal(got, want) {
		t.Errorf("files %v, want %v", got, want)
	}
	slices.Sort(ignored)
	if want := []string{".json", "README.md", "sub.json"}; !slices.Equal(ignored, want) {
		t.Errorf("ignored %v, want %v", ignored, want)
	}
	if _, _, err := ReadSchemaDir(writeFiles(t, map[string]string{"a.json": "{}", "a.avsc": "{}"})); err == nil ||
		!strings.Contains(err.Error(), `subject "a"`) {
		t.Errorf("two files for one subject: %v", err)
	}
	if _, _, err := ReadSchemaDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing directory is no error")
	}
}

// TestRegisterFile: a new subject is registered, the same text again is
// unchanged (nothing registered), a new text is registered as version 2
// after the compatibility check, a dry run registers nothing. (srfake
// finds everything compatible: the refusal is proven against Apicurio in
// test/contracts.)
func TestRegisterFile(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := srfake.New()
	defer fake.Close()
	c, _ := newTestContracts(t, fake.URL(), Config{})
	reg := c.Registry()
	v1 := SchemaFile{Subject: subject, Path: "s.json", Type: sr.TypeJSON, Text: orderSchema}
	v2 := v1
	v2.Text = strings.Replace(orderSchema, `"type": "object"`, `"type": "object", "title": "v2"`, 1)
	for i, tc := range []struct {
		f       SchemaFile
		dryRun  bool
		want    Outcome
		version int
		isNew   bool
	}{
		{v1, true, OutcomeCompatible, 0, true},
		{v1, false, OutcomeRegistered, 1, true},
		{v1, false, OutcomeUnchanged, 1, false},
		{v2, true, OutcomeCompatible, 0, false},
		{v2, false, OutcomeRegistered, 2, false},
		{v1, false, OutcomeUnchanged, 1, false},
	} {
		g := reg.RegisterFile(ctx, tc.f, tc.dryRun)
		if g.Outcome != tc.want || g.Version != tc.version || g.New != tc.isNew || g.Failed() {
			t.Fatalf("step %d: %+v; want %s version %d new %v", i, g, tc.want, tc.version, tc.isNew)
		}
	}
	fake.Close()
	if g := reg.RegisterFile(ctx, v1, false); g.Outcome != OutcomeFailed || !g.Failed() || len(g.Reasons) == 0 {
		t.Fatalf("registry down: %+v; want failed with the reason", g)
	}
}
