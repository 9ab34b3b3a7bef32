package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

// runCmd is outbox-cdc run: the connector.
type runCmd struct{}

func (*runCmd) register(*flag.FlagSet) {}
func (*runCmd) problem() string        { return "" }

func (*runCmd) run(ctx context.Context, e env) int {
	cfg, pc, log, stderr := e.cfg, e.pc, e.log, e.stderr
	pc.Sink.RetryEOF = true
	m := metrics.New()
	tp, stopTracing, err := startTracing(ctx, cfg.OTel, m, log)
	if err != nil {
		log.Error("tracing", "err", err)
		return ExitFailure
	}
	if tp != nil {
		pc.Tracer = tp
		defer stopTracing() // after the pipeline drained: every span has ended
	}
	p, err := pipeline.New(pc, m, log)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-cdc: %v\n", err)
		return ExitUsage
	}
	if cfg.HTTP.Listen != "" {
		srv, err := serveHTTP(cfg.HTTP, m, p, log)
		if err != nil {
			log.Error("http listener", "listen", cfg.HTTP.Listen, "err", err)
			return ExitFailure
		}
		defer srv.Close()
	}
	if err := p.Run(ctx); err != nil {
		// Logged once, here, at the top.
		log.Error("connector failed", "err", err)
		return ExitFailure
	}
	return ExitOK
}

// serveHTTP starts /metrics, /healthz and /readyz (and /debug/pprof/ with
// http.pprof) on http.listen.
func serveHTTP(hc config.HTTP, m *metrics.Metrics, p *pipeline.Pipeline, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", hc.Listen)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !p.Streaming() {
			http.Error(w, "not streaming", http.StatusServiceUnavailable)
			return
		}
		if s := p.ContractsWaiting(); s != "" {
			http.Error(w, fmt.Sprintf("waiting for the schema registry to resolve subject %q", s), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if hc.PProf {
		// Index serves the named profiles too (heap, goroutine, allocs, ...).
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		// Serve ends with ErrServerClosed when Close is called.
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	return srv, nil
}
