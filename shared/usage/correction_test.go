package usage_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
)

func TestPlanCorrection(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	g := usage.Gate{Recorder: rec, Sources: usage.Sources{"api_calls": usage.SourceEvents}}
	at := oct1.Add(3 * time.Hour)
	orig, err := gateRecord(t, pool, g, usage.Event{Tenant: "org_123", EventID: "e-1", Feature: "api_calls", Quantity: 10, OccurredAt: at})
	if err != nil {
		t.Fatal(err)
	}
	neg, err := gateRecord(t, pool, g, usage.Event{Tenant: "org_123", EventID: "c-1", Feature: "api_calls", Quantity: -4, OccurredAt: at, CorrectsEventID: "e-1"})
	if err != nil {
		t.Fatal(err)
	}
	pos, err := gateRecord(t, pool, g, usage.Event{Tenant: "org_123", EventID: "c-2", Feature: "api_calls", Quantity: 3, OccurredAt: at, CorrectsEventID: "e-1"})
	if err != nil {
		t.Fatal(err)
	}
	now := at.Add(time.Hour)
	plan := func(row outbox.Row) usage.CorrectionPlan {
		t.Helper()
		p, err := usage.PlanCorrection(ctx, pool, row, &now)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := plan(pos); p.Action != usage.CorrectionSendEvent || p.Value != 3 {
		t.Fatalf("positive: %+v", p)
	}
	// The original has not reached Stripe yet: wait.
	if p := plan(neg); p.Action != usage.CorrectionWait {
		t.Fatalf("original pending: %+v", p)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox_items SET state = 'accepted', first_attempt_at = $2 WHERE id = $1`, orig.ID, at.Add(30*time.Minute)); err != nil {
		t.Fatal(err)
	}
	p := plan(neg)
	if p.Action != usage.CorrectionCancelRestate || p.Value != 6 || p.CancelIdentifier != orig.IdempotencyKey ||
		p.CancelIdempotencyKey != neg.IdempotencyKey+":cancel" {
		t.Fatalf("within the window: %+v", p)
	}
	now = at.Add(30*time.Minute + usage.CancelWindow)
	if p := plan(neg); p.Action != usage.CorrectionNotCancellable {
		t.Fatalf("past the window: %+v", p)
	}
	now = at.Add(time.Hour)
	if _, err := pool.Exec(ctx, `UPDATE outbox_items SET state = 'rejected' WHERE id = $1`, orig.ID); err != nil {
		t.Fatal(err)
	}
	if p := plan(neg); p.Action != usage.CorrectionNotCancellable {
		t.Fatalf("original rejected: %+v", p)
	}
	if _, err := usage.PlanCorrection(ctx, pool, orig, &now); !errors.Is(err, usage.ErrNotCorrection) {
		t.Fatalf("an event: %v", err)
	}
}

func TestPeriodEnd(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	for p, want := range map[usage.Period]time.Time{
		usage.PeriodHour:  start.Add(time.Hour),
		usage.PeriodDay:   start.AddDate(0, 0, 1),
		usage.PeriodMonth: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC),
	} {
		if got := p.End(start); !got.Equal(want) {
			t.Errorf("%s.End = %v, want %v", p, got, want)
		}
	}
}
