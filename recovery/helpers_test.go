package recovery_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/shared/clock"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const account = "acct_1Test"

var (
	sept    = time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	rec     = usage.Recorder{DestinationAccount: account, Mode: identity.ModeTest, Period: usage.PeriodDay}
	testNow = time.Date(2026, 9, 15, 9, 30, 0, 0, time.UTC)
)

type fixture struct {
	t     *testing.T
	ctx   context.Context
	pool  *pgxpool.Pool
	clock *clock.Manual
	svc   *recovery.Service
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := dbtest.New(t)
	f := &fixture{t: t, ctx: context.Background(), pool: pool, clock: clock.NewManual(testNow)}
	f.svc = recovery.New(pool, recovery.Config{Clock: f.clock})
	f.exec(`INSERT INTO stripe_accounts (account_id, mode, confirmed) VALUES ($1, 'test', true)`, account)
	return f
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

func (f *fixture) mapFeature(feature string, version int32) {
	f.t.Helper()
	f.exec(`INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name, mapping_version)
		VALUES ($1, $2, 'mtr_1', $2, $3)
		ON CONFLICT (destination_account, feature) DO UPDATE SET mapping_version = EXCLUDED.mapping_version`, account, feature, version)
}

// stageWindow stages a usage window item for the buffered period of sept
// and links it from usage_windows, as the buffered reporter does.
func (f *fixture) stageWindow(tenant string, from, to int64, generation int) outbox.Row {
	f.t.Helper()
	var row outbox.Row
	err := pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
		var err error
		row, err = outbox.Stage(f.ctx, tx, windowItem(tenant, from, to, generation))
		if err != nil {
			return err
		}
		_, err = tx.Exec(f.ctx, `
			INSERT INTO usage_windows (tenant, feature, period_start, acknowledged_to, generation, staged_item_id)
			VALUES ($1, 'api_calls', $2, $3, $4, $5)
			ON CONFLICT (tenant, feature, period_start) DO UPDATE SET staged_item_id = EXCLUDED.staged_item_id`,
			tenant, sept, from, generation, row.ID)
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return row
}

func windowItem(tenant string, from, to int64, generation int) outbox.Item {
	return outbox.Item{
		Identity: identity.Identity{
			Tenant: tenant, SubjectKind: identity.SubjectUsageWindow,
			SubjectRef: usage.WindowSubjectRef("api_calls", sept, from, to, generation),
			Exporter:   outbox.DefaultExporter, DestinationAccount: account, Mode: identity.ModeTest, MappingVersion: 1,
		},
		Feature: "api_calls", Quantity: to - from, OccurredAt: sept.Add(23 * time.Hour), PeriodStart: sept,
	}
}

func (f *fixture) record(ev usage.Event) outbox.Row {
	f.t.Helper()
	var row outbox.Row
	err := pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
		var err error
		row, _, err = rec.Record(f.ctx, tx, ev)
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return row
}

// makeUncertain moves an item to uncertain the way a deliverer does after
// its lease leaseToken: attempts exhausted.
func (f *fixture) makeUncertain(id, leaseToken int64) outbox.Row {
	f.t.Helper()
	f.exec(`UPDATE outbox_items SET state = 'uncertain', lease_token = $2, attempts = 3,
		first_attempt_at = '2026-09-14T09:00:00Z', lease_expires_at = NULL, last_error = 'timeout awaiting response'
		WHERE id = $1`, id, leaseToken)
	for a := int64(1); a <= leaseToken; a++ {
		f.exec(`INSERT INTO outbox_attempts (item_id, attempt, lease_token, started_at, finished_at, outcome, error_code)
			VALUES ($1, $2::int, $3::bigint, '2026-09-14T09:00:00Z'::timestamptz + make_interval(mins => $2::int),
			        '2026-09-14T09:00:30Z'::timestamptz + make_interval(mins => $2::int), $4, 'timeout')`,
			id, a, a, map[bool]string{true: "uncertain", false: "retry"}[a == leaseToken])
	}
	return f.get(id)
}

func (f *fixture) makeQuarantined(id int64, reason outbox.Reason) outbox.Row {
	f.t.Helper()
	f.exec(`UPDATE outbox_items SET state = 'quarantined', quarantine_reason = $2, lease_token = 1, attempts = 1,
		first_attempt_at = '2026-09-14T09:00:00Z', published_dispatch = dispatch WHERE id = $1`, id, string(reason))
	return f.get(id)
}

func (f *fixture) get(id int64) outbox.Row {
	f.t.Helper()
	row, err := outbox.Get(f.ctx, f.pool, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return row
}

func (f *fixture) actions(id int64) []recovery.Action {
	f.t.Helper()
	acts, err := f.svc.Actions(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return acts
}

func (f *fixture) count(sql string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(f.ctx, sql, args...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func jsonField(t *testing.T, raw json.RawMessage, field string) any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return m[field]
}

func ptr[T any](v T) *T { return &v }
