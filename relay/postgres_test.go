package relay

import (
	"context"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/natstest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Postgres drops every relay connection, the LISTEN one included, again and
// again for a while: the relay keeps running, backs off, reconnects, and
// everything staged is published, once per dispatch. Polling is set to a
// minute, so the rows staged after the outage are found through NOTIFY on
// the re-established LISTEN connection (or its reconnect wake-up).
func TestPostgresConnectionsKilledMidRun(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.NewDatabase(t)
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = "relay_under_test"
	pcfg.MaxConns = 10
	relayPool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relayPool.Close)
	pool, err := pgxpool.New(ctx, dbURL) // the application's, untouched
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	_, js := connect(t, natstest.New(t))
	cfg := testConfig()
	cfg.PollMS = 60000
	reg := prometheus.NewRegistry()
	run := start(t, relayPool, js, cfg, WithRegistry(reg))
	stage(t, pool, items("org_pg", 0, 100)...)
	eventually(t, "first rows published", func() (bool, error) {
		n, err := publishedCount(ctx, pool)
		return n == 100, err
	})

	killed := 0
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'relay_under_test'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		killed += n
		stage(t, pool, items("org_pg", 100+killed*1000, 5)...)
		time.Sleep(20 * time.Millisecond)
	}
	if killed == 0 {
		t.Fatal("no relay connection was terminated")
	}
	select {
	case err := <-run.done:
		t.Fatalf("relay stopped during the Postgres outage: %v", err)
	default:
	}
	var staged int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_items`).Scan(&staged); err != nil {
		t.Fatal(err)
	}
	stage(t, pool, items("org_pg", 9_000_000, 10)...)
	staged += 10
	eventually(t, "everything published after the outage", func() (bool, error) {
		n, err := publishedCount(ctx, pool)
		return n == staged, err
	})
	seen := map[int64]int{}
	for _, m := range streamMsgs(t, js) {
		seen[m.body.ItemID]++
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("item %d held %d times", id, c)
		}
	}
	if len(seen) != staged {
		t.Fatalf("stream holds %d items, %d staged", len(seen), staged)
	}
	t.Logf("terminated %d relay connections; %d rows staged", killed, staged)
}
