package deploy_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// grafanaVars replaces Grafana's built-in interval variables with values a
// plain Prometheus query accepts.
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$__interval", "15s", "$__range", "1h")

type panelExpr struct{ panel, expr string }

// dashboardExprs returns every PromQL expression of grafana/aurora.json.
func dashboardExprs(t *testing.T) []panelExpr {
	t.Helper()
	b, err := os.ReadFile("grafana/aurora.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/aurora.json: %v", err)
	}
	if d.UID == "" {
		t.Error("dashboard has no uid (provisioning needs a stable one)")
	}
	var out []panelExpr
	for _, p := range d.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q has an empty expression", p.Title)
			}
			out = append(out, panelExpr{p.Title, tg.Expr})
		}
	}
	return out
}

// The dashboard shows every figure the gauges export and every family the
// issue names (flow, backlog, uncertain, quarantine, reconciliation, inbox,
// provider latency and answers).
func TestDashboardShowsEveryFigure(t *testing.T) {
	var all strings.Builder
	for _, e := range dashboardExprs(t) {
		all.WriteString(e.expr + "\n")
	}
	for _, m := range []string{
		"aurora_db_outbox_backlog_age_seconds", "aurora_db_outbox_items", "aurora_db_outbox_uncertain_oldest_age_seconds",
		"aurora_db_outbox_quarantined_items", "aurora_db_outbox_last_item_id", "aurora_db_inbox_pending_events",
		"aurora_db_inbox_dead_letters", "aurora_db_inbox_highest_pending_attempts", "aurora_db_inbox_oldest_pending_age_seconds",
		"aurora_db_reconciliation_open_items", "aurora_db_reconciliation_oldest_open_age_seconds",
		"aurora_relay_published_total", `aurora_deliverer_outcomes_total{outcome="accepted"}`, "aurora_outbox_items_confirmed",
		"aurora_deliverer_provider_seconds_bucket", "aurora_inbox_webhooks_total", `up{job=`,
		"aurora_db_events_dead_letters", "aurora_db_events_consumer_dead_letters", "aurora_db_events_consumer_lag_seconds",
		"aurora_db_events_undispatched_oldest_age_seconds", "aurora_events_published_total", "aurora_events_consumer_processed_total",
	} {
		if !strings.Contains(all.String(), m) {
			t.Errorf("no dashboard panel queries %s", m)
		}
	}
}
