package cli

import (
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
)

// The profiler is served only when http.pprof asks for it.
func TestServeHTTPPProf(t *testing.T) {
	for _, tt := range []struct {
		pprof bool
		want  int
	}{{false, http.StatusNotFound}, {true, http.StatusOK}} {
		srv, err := serveHTTP(config.HTTP{Listen: "127.0.0.1:0", PProf: tt.pprof}, metrics.New(), nil, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		addr := srv.Addr
		hc := &http.Client{Timeout: 5 * time.Second}
		resp, err := hc.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
		if err != nil {
			srv.Close()
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("pprof %v: status %d, want %d", tt.pprof, resp.StatusCode, tt.want)
		}
	}
}
