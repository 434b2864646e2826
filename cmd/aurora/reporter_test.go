package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/jackc/pgx/v5"
)

func TestReporterConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		env     map[string]string
		wantVar string
	}{
		{map[string]string{}, ""},
		{map[string]string{"AURORA_FEATURE_SOURCES": "api_calls:events", "AURORA_REPORTER_OPS_ADDR": "127.0.0.1:9310"}, ""},
		{map[string]string{"AURORA_REPORTER_OPS_ADDR": "nope"}, "AURORA_REPORTER_OPS_ADDR"},
		{map[string]string{"AURORA_FEATURE_SOURCES": "api_calls=events"}, "AURORA_FEATURE_SOURCES"},
		{map[string]string{"AURORA_USAGE_PERIOD": "week"}, "AURORA_USAGE_PERIOD"},
		{map[string]string{"AURORA_REPORTER_INTERVAL_SECONDS": "86401"}, "AURORA_REPORTER_INTERVAL_SECONDS"},
	}
	for _, tt := range tests {
		var c reporterConfig
		err := config.LoadFrom(&c, tt.env)
		if tt.wantVar == "" {
			if err != nil {
				t.Errorf("%v: %v", tt.env, err)
			}
			continue
		}
		var re *config.RangeError
		if !errors.As(err, &re) || re.Var != tt.wantVar {
			t.Errorf("%v: got %v, want a RangeError naming %s", tt.env, err, tt.wantVar)
		}
	}
}

func TestReporterOnceStagesAWindow(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	t.Setenv("AURORA_DATABASE_URL", dbURL)
	t.Setenv("AURORA_STRIPE_ACCOUNT", "acct_1Test")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	day := time.Now().UTC().Truncate(24 * time.Hour)
	if _, err := conn.Exec(ctx, `INSERT INTO usage_counters (tenant, feature, period_start, count) VALUES ('org_123', 'api_calls', $1, 5)`, day); err != nil {
		t.Fatal(err)
	}
	if code := run(ctx, []string{"reporter", "--once"}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	var ref, account string
	if err := conn.QueryRow(ctx, `SELECT subject_ref, destination_account FROM outbox_items`).Scan(&ref, &account); err != nil {
		t.Fatal(err)
	}
	if want := "usage:api_calls:" + day.Format(time.RFC3339) + ":0:5"; ref != want || account != "acct_1Test" {
		t.Fatalf("staged %s on %s, want %s on acct_1Test", ref, account, want)
	}
	t.Setenv("AURORA_FEATURE_SOURCES", "api_calls:stream")
	if code := run(ctx, []string{"reporter", "--validate"}); code != 2 {
		t.Fatalf("invalid configuration: exit %d, want 2", code)
	}
}
