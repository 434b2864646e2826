// Package ops serves a service's operational endpoints on one listener:
// /healthz (the process is alive), /readyz (its dependencies answer) and
// /metrics (Prometheus), and shuts down gracefully with the service.
package ops

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check reports whether a dependency is ready; a non-nil error makes
// /readyz answer 503 with the check's name (never the error's details,
// which may carry connection strings).
type Check struct {
	Name string
	Fn   func(ctx context.Context) error
}

// NewRegistry returns a Prometheus registry with the Go and process
// collectors registered.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler returns the mux for /healthz, /readyz and /metrics. extra routes
// may be added to the returned mux by the caller.
func Handler(reg prometheus.Gatherer, checks ...Check) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		for _, c := range checks {
			if err := c.Fn(ctx); err != nil {
				http.Error(w, "not ready: "+c.Name, http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	// A collector that fails its scrape makes /metrics answer 500: no
	// sample is better than a wrong one (seed 000, "What to watch").
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	return mux
}

// Serve listens on addr and serves h until ctx ends, then shuts down within
// 5 s. An empty addr disables the listener and returns when ctx ends.
func Serve(ctx context.Context, addr string, h http.Handler) error {
	if addr == "" {
		<-ctx.Done()
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("ops: listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
}
