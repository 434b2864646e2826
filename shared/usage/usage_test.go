package usage_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

var rec = usage.Recorder{DestinationAccount: "acct_1Test", Mode: identity.ModeTest, Period: usage.PeriodDay}

func TestRecordSameEventTwiceStagesOneItem(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	ev := usage.Event{Tenant: "org_123", EventID: "req-1", Feature: "api_calls", Quantity: 1, OccurredAt: time.Date(2026, 9, 1, 10, 0, 0, 0, time.UTC)}
	var ids []int64
	for i := range 2 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			row, created, err := rec.Record(ctx, tx, ev)
			if err != nil {
				return err
			}
			if created != (i == 0) {
				t.Errorf("call %d: created=%v", i, created)
			}
			if row.SubjectRef != "event:req-1" || row.SubjectKind != identity.SubjectEvent || row.MappingVersion != 0 {
				t.Errorf("unexpected item %+v", row)
			}
			if !row.PeriodStart.Equal(time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)) {
				t.Errorf("period start %v", row.PeriodStart)
			}
			ids = append(ids, row.ID)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if ids[0] != ids[1] {
		t.Fatalf("items %v, want one", ids)
	}
	var items, events int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_items), (SELECT count(*) FROM usage_events)`).Scan(&items, &events); err != nil {
		t.Fatal(err)
	}
	if items != 1 || events != 1 {
		t.Fatalf("items=%d events=%d, want 1 and 1", items, events)
	}
	// Same id, different content: typed error, nothing written.
	ev.Quantity = 2
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, _, err := rec.Record(ctx, tx, ev); return err })
	if !errors.Is(err, usage.ErrEventConflict) {
		t.Fatalf("got %v, want ErrEventConflict", err)
	}
}

func TestRecordUsesCurrentMappingVersion(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO stripe_accounts (account_id, mode, confirmed) VALUES ('acct_1Test', 'test', true);
		INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name, mapping_version) VALUES ('acct_1Test', 'api_calls', 'mtr_1', 'api_calls', 3)`); err != nil {
		t.Fatal(err)
	}
	ev := usage.Event{Tenant: "org_123", EventID: "req-2", Feature: "api_calls", Quantity: 1, OccurredAt: time.Now()}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		row, _, err := rec.Record(ctx, tx, ev)
		if err == nil && row.MappingVersion != 3 {
			t.Errorf("mapping version %d, want 3", row.MappingVersion)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestRecordInvalidEvent(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	tests := map[string]usage.Event{
		"tenant":            {EventID: "e", Feature: "f", OccurredAt: time.Now()},
		"event_id":          {Tenant: "t", Feature: "f", OccurredAt: time.Now()},
		"feature":           {Tenant: "t", EventID: "e", OccurredAt: time.Now()},
		"occurred_at":       {Tenant: "t", EventID: "e", Feature: "f"},
		"quantity":          {Tenant: "t", EventID: "e", Feature: "f", OccurredAt: time.Now(), Quantity: -1},
		"corrects_event_id": {Tenant: "t", EventID: "e", Feature: "f", OccurredAt: time.Now(), CorrectsEventID: "e"},
	}
	for field, ev := range tests {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, _, err := rec.Record(ctx, tx, ev); return err })
		var fe *usage.FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: got %v", field, err)
		}
	}
}

func TestIncrementAccumulatesPerPeriod(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	at := time.Date(2026, 9, 1, 10, 0, 0, 0, time.UTC)
	var last int64
	for _, d := range []time.Duration{0, time.Hour, 2 * time.Hour} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			last, err = rec.Increment(ctx, tx, "org_123", "api_calls", at.Add(d), 2)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if last != 6 {
		t.Fatalf("count %d, want 6", last)
	}
	// Next day is another period.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		last, err = rec.Increment(ctx, tx, "org_123", "api_calls", at.Add(24*time.Hour), 1)
		return err
	})
	if err != nil || last != 1 {
		t.Fatalf("next period count %d err %v", last, err)
	}
}

func TestPeriodStart(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 9, 17, 13, 45, 12, 0, time.FixedZone("x", 3600))
	tests := []struct {
		p    usage.Period
		want time.Time
	}{
		{usage.PeriodHour, time.Date(2026, 9, 17, 12, 0, 0, 0, time.UTC)},
		{usage.PeriodDay, time.Date(2026, 9, 17, 0, 0, 0, 0, time.UTC)},
		{usage.PeriodMonth, time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)},
	}
	for _, tt := range tests {
		if got := tt.p.Start(at); !got.Equal(tt.want) {
			t.Errorf("%s: %v, want %v", tt.p, got, tt.want)
		}
	}
}
