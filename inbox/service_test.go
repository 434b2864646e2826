package inbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/config"
	"github.com/jackc/pgx/v5/pgxpool"
)

// On a database where migrations were never applied /readyz is not ready
// and says why (a webhook would get 503).
func TestReadyzNotReadyOnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbtest.NewEmptyDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reg := newTestRegistry()
	srv := httptest.NewServer(NewMux(pool, NewHandler(NewStore(pool, nil), []string{testSecret}, nil, nil), reg))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "billing_events") ||
		!strings.Contains(string(body), "aurora migrate") {
		t.Fatalf("/readyz on an unmigrated database: %d %q, want 503 naming billing_events and aurora migrate", resp.StatusCode, body)
	}
}

// Run refuses to start, naming the migration, on a database that is not
// migrated or whose recorded checksum of a migration differs from this
// build's file.
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
			cfg := Config{Addr: "127.0.0.1:0", WebhookSecrets: []string{testSecret}, PollMS: PollMSDefault,
				BatchSize: BatchSizeDefault, Database: config.Database{URL: tc.url}}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var logs bytes.Buffer
			err := Run(ctx, cfg, slog.New(slog.NewJSONHandler(&logs, nil)))
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("Run: %v, want %v naming %s", err, tc.want, tc.names)
			}
			if strings.Contains(logs.String(), "inbox starting") {
				t.Fatal("the inbox started")
			}
		})
	}
}
