package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fixture is a migrated database with one confirmed test account.
type fixture struct {
	t       testing.TB
	ctx     context.Context
	pool    *pgxpool.Pool
	account string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{t: t, ctx: context.Background(), pool: dbtest.New(t), account: "acct_test"}
	f.exec(`INSERT INTO stripe_accounts (account_id, mode, confirmed, confirmed_at) VALUES ($1, 'test', true, now())`, f.account)
	return f
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatalf("exec %q: %v", sql, err)
	}
}

// item stages an outbox item directly in state (lease token 1, one attempt).
func (f *fixture) item(tenant, kind, ref, feature string, qty int64, occurred time.Time, state string) int64 {
	f.t.Helper()
	var id int64
	err := f.pool.QueryRow(f.ctx, `INSERT INTO outbox_items (tenant, subject_kind, subject_ref, exporter, destination_account, mode,
			mapping_version, feature, quantity, occurred_at, period_start, state, lease_token, attempts, quarantine_reason)
		VALUES ($1, $2, $3, 'stripe_meter_events', $4, 'test', 1, $5, $6, $7, date_trunc('day', $7::timestamptz), $8, 1, 1,
			CASE WHEN $8 = 'quarantined' THEN 'negative_quantity' END) RETURNING id`,
		tenant, kind, ref, f.account, feature, qty, occurred, state).Scan(&id)
	if err != nil {
		f.t.Fatalf("stage item: %v", err)
	}
	return id
}

func (f *fixture) count(sql string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(f.ctx, sql, args...).Scan(&n); err != nil {
		f.t.Fatalf("count %q: %v", sql, err)
	}
	return n
}
