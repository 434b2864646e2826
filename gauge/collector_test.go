package gauge_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/gauge"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/ops"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func scrape(t *testing.T, srv *httptest.Server) (int, string) {
	t.Helper()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestCollectorExportsEveryGauge(t *testing.T) {
	pool := dbtest.New(t)
	insertItems(t, pool,
		item{state: outbox.StateUncertain, changed: time.Minute},
		item{state: outbox.StateQuarantined, reason: string(outbox.ReasonModeMismatch)})
	cfg := gauge.DefaultConfig()
	cfg.MinIntervalMS = 0
	r, err := gauge.NewReader(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(gauge.NewCollector(r, nil))
	if problems, err := testutil.CollectAndLint(gauge.NewCollector(r, nil)); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	want := `
# HELP aurora_db_outbox_items Outbox items in this state (pending, leased, uncertain, quarantined), capped at aurora_db_count_cap.
# TYPE aurora_db_outbox_items gauge
aurora_db_outbox_items{state="leased"} 0
aurora_db_outbox_items{state="pending"} 0
aurora_db_outbox_items{state="quarantined"} 1
aurora_db_outbox_items{state="uncertain"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), gauge.MetricOutboxItems); err != nil {
		t.Error(err)
	}
	n, err := testutil.GatherAndCount(reg)
	if err != nil {
		t.Fatal(err)
	}
	// 3 backlog states + 4 counted states + uncertain oldest + 9 quarantine
	// labels + last id + pending + dead letters (every inbox reason + other)
	// + highest + oldest + 11 open kinds + 11 oldest kinds + cap.
	if min := 3 + 4 + 1 + 9 + 1 + 1 + 1 + 1 + 1 + 11 + 11 + 1; n < min {
		t.Errorf("%d samples, want at least %d", n, min)
	}
	for _, m := range []string{gauge.MetricEventsUndispatched, gauge.MetricEventsDeadLetters} {
		if got, err := testutil.GatherAndCount(reg, m); err != nil || got != 1 {
			t.Errorf("%s has %d samples (%v), want 1", m, got, err)
		}
	}
	insertDomainEvents(t, pool, map[string][]string{"ledger": {"InvoicePaid.v1"}},
		domainEvent{eventType: "InvoicePaid.v1", status: "dispatched", created: time.Minute, dispatched: time.Minute})
	wantEvents := `
# HELP aurora_db_events_consumer_dead_letters Domain events dead-lettered for this consumer, capped at aurora_db_count_cap.
# TYPE aurora_db_events_consumer_dead_letters gauge
aurora_db_events_consumer_dead_letters{consumer="ledger"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(wantEvents), gauge.MetricEventsConsumerDead); err != nil {
		t.Error(err)
	}
	if got, err := testutil.GatherAndCount(reg, gauge.MetricEventsConsumerLag); err != nil || got != 1 {
		t.Errorf("%s has %d samples (%v), want one per registered consumer", gauge.MetricEventsConsumerLag, got, err)
	}
	got, err := testutil.GatherAndCount(reg, gauge.MetricQuarantined)
	if err != nil || got != len(outbox.Reasons)+1 {
		t.Errorf("%s has %d samples (%v), want one per reason + other = %d", gauge.MetricQuarantined, got, err, len(outbox.Reasons)+1)
	}
}

// The must-show: the database goes away under a running exporter and its
// scrape fails (HTTP 500, so Prometheus records up == 0) instead of
// reporting a zero backlog.
func TestScrapeFailsNotZeroWhenTheDatabaseGoesAway(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, u.Host)
	u.Host = px.Addr()
	pcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	insertItems(t, pool, item{state: outbox.StatePending, staged: time.Minute})

	cfg := gauge.DefaultConfig()
	cfg.MinIntervalMS = 0
	cfg.QueryTimeoutMS = 3000
	r, err := gauge.NewReader(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	reg := prometheus.NewRegistry()
	reg.MustRegister(gauge.NewCollector(r, slog.New(slog.NewJSONHandler(&logs, nil))))
	srv := httptest.NewServer(ops.Handler(reg))
	defer srv.Close()

	code, body := scrape(t, srv)
	if code != http.StatusOK || !strings.Contains(body, `aurora_db_outbox_items{state="pending"} 1`) {
		t.Fatalf("healthy scrape: %d\n%s", code, body)
	}

	px.Cut()
	code, body = scrape(t, srv)
	if code != http.StatusInternalServerError {
		t.Fatalf("scrape with the database gone: status %d, want 500\n%s", code, body)
	}
	for _, m := range []string{gauge.MetricBacklogAge, gauge.MetricOutboxItems + "{", gauge.MetricUncertainOldestAge} {
		if strings.Contains(body, m) {
			t.Errorf("failed scrape still carries a %s sample:\n%s", m, body)
		}
	}
	if !strings.Contains(logs.String(), "measurement failed") {
		t.Errorf("the failure was not logged: %q", logs.String())
	}
}
