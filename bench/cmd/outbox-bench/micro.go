package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// MicroResult is one line of go test -bench -benchmem output.
type MicroResult struct {
	Package     string  `json:"package"`
	Name        string  `json:"name"`
	Iterations  int64   `json:"iterations"`
	NsPerOp     float64 `json:"ns_per_op"`
	MBPerSec    float64 `json:"mb_per_sec,omitempty"`
	BytesPerOp  float64 `json:"bytes_per_op"`
	AllocsPerOp float64 `json:"allocs_per_op"`
}

func parseMicroFile(path string) ([]MicroResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	res, err := parseMicro(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return res, nil
}

// parseMicro reads benchmark lines ("BenchmarkX-2  N  v ns/op  v B/op ...")
// and the "pkg:" lines that say which package they belong to.
func parseMicro(out string) ([]MicroResult, error) {
	var (
		pkg string
		res []MicroResult
	)
	for line := range strings.SplitSeq(out, "\n") {
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		if strings.HasPrefix(line, "--- FAIL") || strings.HasPrefix(line, "FAIL") {
			return nil, fmt.Errorf("benchmark failure: %s", line)
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		iters, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		r := MicroResult{Package: pkg, Name: f[0], Iterations: iters}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "ns/op":
				r.NsPerOp = v
			case "MB/s":
				r.MBPerSec = v
			case "B/op":
				r.BytesPerOp = v
			case "allocs/op":
				r.AllocsPerOp = v
			}
		}
		res = append(res, r)
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("no benchmark results")
	}
	return res, nil
}

// shortPkg is the package path relative to the module.
func shortPkg(p string) string {
	const mod = "github.com/outbox-cdc/outbox-cdc/"
	return strings.TrimPrefix(p, mod)
}
