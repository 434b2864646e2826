package admin

import (
	"context"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestUsageConfigureDryRunThenAudited(t *testing.T) {
	url := dbtest.NewDatabase(t)
	env := map[string]string{"AURORA_DATABASE_URL": url, "AURORA_STRIPE_ACCOUNT": "acct_cfg", "AURORA_FEATURE_SOURCES": "api_calls:events", "AURORA_ACTOR": "ops"}
	code, out, errOut := runCtl(t, env, "usage", "configure")
	if code != 0 || !strings.Contains(out, "stored:  (none") || !strings.Contains(out, "new:     account=acct_cfg mode=test period=day sources=api_calls:events") ||
		!strings.Contains(out, "not provisioned") || !strings.Contains(out, "dry run") {
		t.Fatalf("dry run: %d %q %q", code, out, errOut)
	}
	code, _, errOut = runCtl(t, env, "usage", "configure", "--yes")
	if code != ExitInvalidInput || !strings.Contains(errOut, "--reason is required") {
		t.Fatalf("--yes without --reason: %d %q", code, errOut)
	}
	code, _, errOut = runCtl(t, env, "usage", "configure", "--mode", "prod")
	if code != ExitInvalidInput || !strings.Contains(errOut, "mode") {
		t.Fatalf("bad mode: %d %q", code, errOut)
	}
	code, out, errOut = runCtl(t, env, "usage", "configure", "--period", "hour", "--reason", "enable SQL recording", "--yes")
	if code != 0 || !strings.Contains(out, "stored:  account=acct_cfg mode=test period=hour") {
		t.Fatalf("apply: %d %q %q", code, out, errOut)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := usage.ReadSQLSettings(context.Background(), pool)
	if err != nil || s.DestinationAccount != "acct_cfg" || s.Period != usage.PeriodHour || s.Sources["api_calls"] != usage.SourceEvents {
		t.Fatalf("stored %+v %v", s, err)
	}
	var actor, reason string
	if err := pool.QueryRow(context.Background(), `SELECT actor, reason FROM recovery_actions WHERE action = 'usage_configure' AND item_id IS NULL`).Scan(&actor, &reason); err != nil || actor != "ops" || reason != "enable SQL recording" {
		t.Fatalf("audit row: %q %q %v", actor, reason, err)
	}
}
