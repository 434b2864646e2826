package gauge

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/jackc/pgx/v5"
)

// Every query is served by an index: with sequential scans disabled the
// planner still uses a Seq Scan only where no index can answer, so a plan
// free of them pins the bounded cost the package documents.
func TestEveryQueryReadsAnIndex(t *testing.T) {
	pool := dbtest.New(t)
	ctx := context.Background()
	now := time.Date(2026, 9, 15, 9, 30, 0, 0, time.UTC)
	for _, q := range []struct {
		name string
		sql  string
		args pgx.NamedArgs
	}{
		{"outbox ages", sqlOutboxAges, pgx.NamedArgs{"now": &now}},
		{"outbox counts", sqlOutboxCounts, pgx.NamedArgs{"cap": 100}},
		{"outbox quarantine", sqlOutboxQuarantine, pgx.NamedArgs{"cap": 100, "reasons": []string{"customer_missing"}}},
		{"inbox", sqlInbox, pgx.NamedArgs{"now": &now, "cap": 100}},
		{"reconciliation", sqlReconciliation, pgx.NamedArgs{"now": &now, "cap": 100, "kinds": []string{"summary_shortfall"}}},
		{"domain events", sqlEvents, pgx.NamedArgs{"now": &now, "cap": 100}},
		{"domain event consumers", sqlEventConsumers, pgx.NamedArgs{"now": &now, "cap": 100}},
		{"inbox dead letters", sqlInboxDeadLetters, pgx.NamedArgs{"cap": 100, "reasons": []string{"unmapped_stripe_price"}}},
	} {
		t.Run(q.name, func(t *testing.T) {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
					return err
				}
				var plan []map[string]any
				if err := tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+q.sql, q.args).Scan(&plan); err != nil {
					return err
				}
				b, _ := json.Marshal(plan)
				for _, rel := range seqScans(plan) {
					if !smallRegistries[rel] {
						t.Errorf("plan has a sequential scan of %s:\n%s", rel, b)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// smallRegistries are tables of a handful of rows that a gauge reads whole
// on purpose: event_consumers holds one row per registered consumer name.
var smallRegistries = map[string]bool{"event_consumers": true}

// seqScans returns the relation of every Seq Scan node in an EXPLAIN (FORMAT
// JSON) plan.
func seqScans(v any) []string {
	var out []string
	switch n := v.(type) {
	case []map[string]any:
		for _, m := range n {
			out = append(out, seqScans(m)...)
		}
	case []any:
		for _, m := range n {
			out = append(out, seqScans(m)...)
		}
	case map[string]any:
		if n["Node Type"] == "Seq Scan" {
			rel, _ := n["Relation Name"].(string)
			out = append(out, rel)
		}
		for _, c := range n {
			out = append(out, seqScans(c)...)
		}
	}
	return out
}

func TestCachedReusesAMeasurementForTheMinInterval(t *testing.T) {
	pool := dbtest.New(t)
	cfg := DefaultConfig()
	cfg.MinIntervalMS = 5000
	r, err := NewReader(pool, cfg, WithClock(clock.NewManual(time.Date(2026, 9, 15, 9, 30, 0, 0, time.UTC))))
	if err != nil {
		t.Fatal(err)
	}
	procNow := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r.now = func() time.Time { return procNow }
	ctx := context.Background()
	first, err := r.Cached(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_items (tenant, subject_kind, subject_ref, exporter, destination_account, mode,
		mapping_version, idempotency_key, feature, quantity, occurred_at, period_start, state, updated_at)
		VALUES ('tn', 'event', 'event:c1', 'x', 'acct', 'test', 1, '', 'api_calls', 1, now(), now(), 'uncertain', now())`); err != nil {
		t.Fatal(err)
	}
	procNow = procNow.Add(4 * time.Second)
	again, err := r.Cached(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if again.Outbox.Items["uncertain"] != first.Outbox.Items["uncertain"] {
		t.Errorf("inside the interval: uncertain %d, want the cached %d", again.Outbox.Items["uncertain"], first.Outbox.Items["uncertain"])
	}
	procNow = procNow.Add(2 * time.Second)
	fresh, err := r.Cached(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Outbox.Items["uncertain"] != 1 {
		t.Errorf("after the interval: uncertain %d, want 1", fresh.Outbox.Items["uncertain"])
	}
}
