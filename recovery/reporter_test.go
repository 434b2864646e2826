package recovery_test

import (
	"testing"
	"time"

	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/reporter"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// The contract with the real buffered reporter (usage.WindowSubjectRef):
// after an abandon the same bounds restage under a new identity and a new
// key while the old item stays rejected; after an acknowledgement the next
// window starts at the acknowledged bound.
func TestReporterRestagesAfterAbandonAndAdvancesAfterAcknowledge(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rep := &reporter.Reporter{Pool: f.pool, Recorder: rec}
	increment := func(tenant string, n int64) {
		t.Helper()
		err := pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
			_, err := rec.Increment(f.ctx, tx, tenant, "api_calls", sept.Add(10*time.Hour), n)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	report := func(tenant string, want reporter.Outcome) outbox.Row {
		t.Helper()
		res, err := rep.ReportPeriod(f.ctx, tenant, "api_calls", sept)
		if err != nil || res.Outcome != want {
			t.Fatalf("report %s: %v %s, want %s", tenant, err, res.Outcome, want)
		}
		return res.Window
	}

	// abandon
	increment("org_a", 5)
	old := report("org_a", reporter.OutcomeStaged)
	if old.SubjectRef != "usage:api_calls:2026-09-01T00:00:00Z:0:5" {
		t.Fatalf("window %q", old.SubjectRef)
	}
	old = f.makeUncertain(old.ID, 2)
	if again := report("org_a", reporter.OutcomeOpen); again.ID != old.ID {
		t.Fatalf("uncertain window restaged as %d", again.ID)
	}
	res, err := f.svc.Abandon(f.ctx, old.ID, abandonInput(recovery.ExpectedOf(old)))
	if err != nil {
		t.Fatal(err)
	}
	restaged := report("org_a", reporter.OutcomeStaged)
	if restaged.ID == old.ID || restaged.SubjectRef != "usage:api_calls:2026-09-01T00:00:00Z:0:5:r1" ||
		restaged.IdempotencyKey == old.IdempotencyKey || restaged.IdempotencyKey != res.Change.Window.SameBoundsKey ||
		restaged.Quantity != 5 {
		t.Fatalf("restaged %d %q %s (old %s)", restaged.ID, restaged.SubjectRef, restaged.IdempotencyKey, old.IdempotencyKey)
	}
	if st := f.get(old.ID).State; st != outbox.StateRejected {
		t.Fatalf("old item %s", st)
	}

	// acknowledge
	increment("org_b", 5)
	w := f.makeUncertain(report("org_b", reporter.OutcomeStaged).ID, 1)
	if _, err := f.svc.Acknowledge(f.ctx, w.ID, ackInput(recovery.ExpectedOf(w))); err != nil {
		t.Fatal(err)
	}
	increment("org_b", 3)
	next := report("org_b", reporter.OutcomeStaged)
	if next.SubjectRef != "usage:api_calls:2026-09-01T00:00:00Z:5:8" || next.Quantity != 3 {
		t.Fatalf("next window %q quantity %d", next.SubjectRef, next.Quantity)
	}
	if st := f.get(w.ID).State; st != outbox.StateAccepted {
		t.Fatalf("acknowledged item %s", st)
	}
}
