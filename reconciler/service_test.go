package reconciler

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/config"
)

// Run refuses to start, before any provider call and naming the
// migration, on a database not migrated or whose recorded checksum of a
// migration differs from this build's file.
func TestRunRefusesDatabaseNotOfThisBuild(t *testing.T) {
	t.Parallel()
	mismatched := dbtest.NewAlteredDatabase(t)
	for _, tc := range []struct {
		name, url string
		want      error
		names     string
	}{
		{"never migrated", dbtest.NewEmptyDatabase(t), migrations.ErrNotMigrated, "00001_"},
		{"altered checksum", mismatched, migrations.ErrSchemaMismatch, "00017_take_bumps_dispatch.sql"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg Config
			// The API base is a closed port: a run that got that far would
			// fail on the provider, not on the schema.
			if err := config.LoadFrom(&cfg, map[string]string{"AURORA_STRIPE_API_KEY": "sk_test_abc",
				"AURORA_STRIPE_API_BASE": "http://127.0.0.1:1", "AURORA_DATABASE_URL": tc.url}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var logs bytes.Buffer
			_, err := Run(ctx, cfg, true, slog.New(slog.NewJSONHandler(&logs, nil)))
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("Run: %v, want %v naming %s", err, tc.want, tc.names)
			}
			if strings.Contains(logs.String(), "reconciler starting") {
				t.Fatal("the reconciler started")
			}
		})
	}
}
