package relay

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/prometheus/client_golang/prometheus"
)

// /readyz answers 200 while Postgres and NATS answer, 503 naming the
// dependency when NATS is down, and 200 again after it is back.
func TestReadinessFollowsDependencies(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	srv := natstest.New(t)
	nc, js := connect(t, srv)
	reg := prometheus.NewRegistry()
	r, err := New(pool, js, testConfig(), WithRegistry(reg), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	h := ops.Handler(reg, r.Checks()...)
	readyz := func() (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := readyz(); code != http.StatusOK {
		t.Fatalf("healthy: %d %q", code, body)
	}
	srv.Stop()
	eventually(t, "NATS seen down", func() (bool, error) { return !nc.IsConnected(), nil })
	if code, body := readyz(); code != http.StatusServiceUnavailable || body != "not ready: nats\n" {
		t.Fatalf("NATS down: %d %q", code, body)
	}
	srv.Restart()
	eventually(t, "NATS back", func() (bool, error) { return nc.IsConnected(), nil })
	if code, body := readyz(); code != http.StatusOK {
		t.Fatalf("NATS back: %d %q", code, body)
	}
	pool.Close()
	if code, body := readyz(); code != http.StatusServiceUnavailable || body != "not ready: postgres\n" {
		t.Fatalf("Postgres closed: %d %q", code, body)
	}
}
