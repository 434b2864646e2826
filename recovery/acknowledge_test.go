package recovery_test

import (
	"errors"
	"testing"

	"github.com/aurora-billing/aurora/recovery"
	"github.com/aurora-billing/aurora/shared/outbox"
)

func ackInput(e recovery.Expected) recovery.AcknowledgeInput {
	return recovery.AcknowledgeInput{
		Expected: e, ProviderRef: "req_TEST",
		Reason:   "verified in the Stripe dashboard",
		Evidence: "Stripe request log req_TEST at 2026-09-15T09:12Z shows a 200 for this identifier",
		Actor:    "liam",
	}
}

func TestAcknowledgeMovesToAcceptedNeverConfirmed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	item := f.makeUncertain(f.stageWindow("org_123", 0, 5, 0).ID, 3)

	res, err := f.svc.Acknowledge(f.ctx, item.ID, ackInput(recovery.ExpectedOf(item)))
	if err != nil {
		t.Fatal(err)
	}
	got := f.get(item.ID)
	if got.State != outbox.StateAccepted || res.Item.State != outbox.StateAccepted {
		t.Fatalf("state %s, want accepted (never confirmed)", got.State)
	}
	if got.ProviderRef == nil || *got.ProviderRef != "req_TEST" {
		t.Fatalf("provider_ref %v", got.ProviderRef)
	}
	if got.LeaseToken != 3 || got.Attempts != item.Attempts || got.IdempotencyKey != item.IdempotencyKey {
		t.Fatalf("acknowledge touched more than state: %+v", got)
	}
	a := res.Action
	if !a.Applied || a.Refusal != nil || a.Action != recovery.KindAcknowledge || a.Actor != "liam" ||
		a.Reason == "" || a.Evidence == "" || !a.CreatedAt.Equal(testNow) {
		t.Fatalf("action %+v", a)
	}
	if jsonField(t, a.Expected, "state") != "uncertain" || jsonField(t, a.Observed, "state") != "uncertain" ||
		jsonField(t, a.Expected, "lease_token") != float64(3) {
		t.Fatalf("expected %s observed %s", a.Expected, a.Observed)
	}
	if acts := f.actions(item.ID); len(acts) != 1 || acts[0].ID != a.ID {
		t.Fatalf("actions %+v", acts)
	}
	// The window's ledger advanced to the window's upper bound and its link
	// was cleared: the next window is new work (from 5), a new identity.
	var ackTo int64
	var staged *int64
	if err := f.pool.QueryRow(f.ctx, `SELECT acknowledged_to, staged_item_id FROM usage_windows WHERE tenant = 'org_123'`).Scan(&ackTo, &staged); err != nil {
		t.Fatal(err)
	}
	if ackTo != 5 || staged != nil || res.Change.Window == nil || res.Change.Window.AcknowledgedToTo != 5 {
		t.Fatalf("acknowledged_to %d staged %v change %+v", ackTo, staged, res.Change.Window)
	}
}

func TestAcknowledgeKeepsProviderRefWhenNoneGiven(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	item := f.makeUncertain(f.record(event("req-1")).ID, 2)
	f.exec(`UPDATE outbox_items SET provider_ref = 'req_EARLIER' WHERE id = $1`, item.ID)
	item = f.get(item.ID)
	in := ackInput(recovery.ExpectedOf(item)) // carries provider_ref req_EARLIER, compared
	in.ProviderRef = "  "
	if _, err := f.svc.Acknowledge(f.ctx, item.ID, in); err != nil {
		t.Fatal(err)
	}
	if got := f.get(item.ID); got.State != outbox.StateAccepted || *got.ProviderRef != "req_EARLIER" {
		t.Fatalf("got %s %v", got.State, *got.ProviderRef)
	}
}

// A stale screen: the operator built expected from an old read; since then
// the row moved. The call is refused, tells what the row says now, and is
// recorded as a refused action; nothing else changes.
func TestStaleScreenIsRefusedAndRecorded(t *testing.T) {
	t.Parallel()
	moves := map[string]struct {
		move   func(f *fixture, id int64)
		fields []string
	}{
		"another operator acknowledged": {
			move: func(f *fixture, id int64) {
				if _, err := f.svc.Acknowledge(f.ctx, id, ackInput(recovery.ExpectedOf(f.get(id)))); err != nil {
					f.t.Fatal(err)
				}
			},
			fields: []string{"state"},
		},
		"reclaimed and uncertain again": {
			move: func(f *fixture, id int64) {
				f.exec(`UPDATE outbox_items SET lease_token = lease_token + 1 WHERE id = $1`, id)
			},
			fields: []string{"lease_token"},
		},
		"provider ref appeared": {
			move: func(f *fixture, id int64) {
				f.exec(`UPDATE outbox_items SET provider_ref = 'req_OTHER' WHERE id = $1`, id)
			},
			fields: []string{"provider_ref"},
		},
	}
	for name, tt := range moves {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			item := f.makeUncertain(f.stageWindow("org_123", 0, 5, 0).ID, 3)
			screen := recovery.ExpectedOf(item) // the old read
			screen.ProviderRef = nil
			if name == "provider ref appeared" {
				f.exec(`UPDATE outbox_items SET provider_ref = 'req_SEEN' WHERE id = $1`, item.ID)
				screen.ProviderRef = ptr("req_SEEN")
			}
			tt.move(f, item.ID)
			before := f.get(item.ID)
			nActions := len(f.actions(item.ID))

			res, err := f.svc.Abandon(f.ctx, item.ID, recovery.AbandonInput{
				Expected: screen, Reason: "no meter event for this identifier in the request logs",
				Evidence: "searched 2026-09-15 09:00Z to 10:00Z, 0 results", Actor: "ana",
			})
			var mm *recovery.ExpectedStateMismatchError
			if !errors.Is(err, recovery.ErrExpectedStateMismatch) || !errors.As(err, &mm) {
				t.Fatalf("got %v, want expected_state_mismatch", err)
			}
			if mm.Current.State != before.State || mm.Current.LeaseToken != before.LeaseToken || !equalStrings(mm.Fields, tt.fields) {
				t.Fatalf("current %s/%d fields %v, want %s/%d %v", mm.Current.State, mm.Current.LeaseToken, mm.Fields, before.State, before.LeaseToken, tt.fields)
			}
			// nothing moved
			after := f.get(item.ID)
			if after.State != before.State || after.LeaseToken != before.LeaseToken || !after.UpdatedAt.Equal(before.UpdatedAt) {
				t.Fatalf("row changed: %+v", after)
			}
			if n := f.count(`SELECT count(*) FROM usage_windows WHERE staged_item_id IS NULL OR generation <> 0`); n != 0 && name != "another operator acknowledged" {
				t.Fatalf("window link touched")
			}
			// recorded as a refused action, committed
			acts := f.actions(item.ID)
			if len(acts) != nActions+1 {
				t.Fatalf("%d actions, want %d", len(acts), nActions+1)
			}
			a := acts[len(acts)-1]
			if a.ID != res.Action.ID || a.Applied || a.Refusal == nil || *a.Refusal != recovery.RefusalExpectedStateMismatch ||
				a.Action != recovery.KindAbandon || a.Actor != "ana" || a.Evidence == "" {
				t.Fatalf("refusal action %+v", a)
			}
			if jsonField(t, a.Observed, "state") != string(before.State) || jsonField(t, a.Expected, "state") != "uncertain" {
				t.Fatalf("observed %s expected %s", a.Observed, a.Expected)
			}
		})
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Two operators act on the same uncertain item at once with the same
// screen: exactly one applies, the other is refused with what the row says
// now, and both calls are recorded.
func TestConcurrentAcknowledgeAndAbandonOneWins(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	item := f.makeUncertain(f.stageWindow("org_123", 0, 5, 0).ID, 3)
	screen := recovery.ExpectedOf(item)
	errs := make(chan error, 2)
	go func() {
		_, err := f.svc.Acknowledge(f.ctx, item.ID, ackInput(screen))
		errs <- err
	}()
	go func() {
		_, err := f.svc.Abandon(f.ctx, item.ID, recovery.AbandonInput{Expected: screen, Reason: "r", Evidence: "e", Actor: "ana"})
		errs <- err
	}()
	var applied, refused int
	for range 2 {
		switch err := <-errs; {
		case err == nil:
			applied++
		case errors.Is(err, recovery.ErrExpectedStateMismatch):
			refused++
		default:
			t.Fatal(err)
		}
	}
	if applied != 1 || refused != 1 {
		t.Fatalf("applied %d refused %d", applied, refused)
	}
	if n := f.count(`SELECT count(*) FROM recovery_actions WHERE item_id = $1`, item.ID); n != 2 {
		t.Fatalf("%d actions", n)
	}
	if st := f.get(item.ID).State; st != outbox.StateAccepted && st != outbox.StateRejected {
		t.Fatalf("state %s", st)
	}
}

// Validation refusals on an existing item: typed errors, the row unchanged,
// and each call recorded as a refused action.
func TestValidationRefusalsAreTypedAndRecorded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	item := f.makeUncertain(f.record(event("req-1")).ID, 1)
	good := ackInput(recovery.ExpectedOf(item))
	tests := []struct {
		name    string
		mut     func(in *recovery.AcknowledgeInput)
		want    error
		refusal recovery.Refusal
		actor   string
	}{
		{"blank reason", func(in *recovery.AcknowledgeInput) { in.Reason = "" }, recovery.ErrInvalidReason, recovery.RefusalInvalidReason, "liam"},
		{"whitespace reason", func(in *recovery.AcknowledgeInput) { in.Reason = " \t\n" }, recovery.ErrInvalidReason, recovery.RefusalInvalidReason, "liam"},
		{"blank evidence", func(in *recovery.AcknowledgeInput) { in.Evidence = "" }, recovery.ErrInvalidEvidence, recovery.RefusalInvalidEvidence, "liam"},
		{"whitespace evidence", func(in *recovery.AcknowledgeInput) { in.Evidence = "   " }, recovery.ErrInvalidEvidence, recovery.RefusalInvalidEvidence, "liam"},
		{"blank actor", func(in *recovery.AcknowledgeInput) { in.Actor = " " }, recovery.ErrInvalidActor, recovery.RefusalInvalidActor, "(none)"},
		{"no expected state", func(in *recovery.AcknowledgeInput) { in.Expected.State = "" }, recovery.ErrInvalidExpected, recovery.RefusalInvalidExpected, "liam"},
		{"expected state not uncertain", func(in *recovery.AcknowledgeInput) { in.Expected.State = outbox.StateQuarantined }, recovery.ErrInvalidExpected, recovery.RefusalInvalidExpected, "liam"},
		{"unknown expected state", func(in *recovery.AcknowledgeInput) { in.Expected.State = "done" }, recovery.ErrInvalidExpected, recovery.RefusalInvalidExpected, "liam"},
		{"no expected subject ref", func(in *recovery.AcknowledgeInput) { in.Expected.SubjectRef = "" }, recovery.ErrInvalidExpected, recovery.RefusalInvalidExpected, "liam"},
		{"blank expected provider ref", func(in *recovery.AcknowledgeInput) { in.Expected.ProviderRef = ptr(" ") }, recovery.ErrInvalidExpected, recovery.RefusalInvalidExpected, "liam"},
	}
	for i, tt := range tests {
		in := good
		tt.mut(&in)
		res, err := f.svc.Acknowledge(f.ctx, item.ID, in)
		if !errors.Is(err, tt.want) {
			t.Fatalf("%s: got %v, want %v", tt.name, err, tt.want)
		}
		if res.Action.ID == 0 || res.Action.Applied || *res.Action.Refusal != tt.refusal || res.Action.Actor != tt.actor {
			t.Fatalf("%s: action %+v", tt.name, res.Action)
		}
		if n := len(f.actions(item.ID)); n != i+1 {
			t.Fatalf("%s: %d actions recorded", tt.name, n)
		}
		if got := f.get(item.ID); got.State != outbox.StateUncertain || got.ProviderRef != nil {
			t.Fatalf("%s: row changed to %s", tt.name, got.State)
		}
	}
	var ie *recovery.InvalidExpectedError
	in := good
	in.Expected.State = outbox.StateQuarantined
	if _, err := f.svc.Acknowledge(f.ctx, item.ID, in); !errors.As(err, &ie) || ie.Field != "state" {
		t.Fatalf("got %v", err)
	}
}

func TestNotFoundRecordsNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := recovery.Expected{State: outbox.StateUncertain, SubjectRef: "x"}
	for name, call := range map[string]func() error{
		"acknowledge": func() error { _, err := f.svc.Acknowledge(f.ctx, 999, ackInput(e)); return err },
		"abandon": func() error {
			_, err := f.svc.Abandon(f.ctx, 999, recovery.AbandonInput{Expected: e, Reason: "r", Evidence: "e", Actor: "a"})
			return err
		},
		"requeue": func() error {
			_, err := f.svc.Requeue(f.ctx, 999, recovery.RequeueInput{Expected: e, Reason: "r", Actor: "a"})
			return err
		},
		"preview": func() error { _, err := f.svc.PreviewAbandon(f.ctx, 999, recovery.AbandonInput{}); return err },
		"inspect": func() error { _, err := f.svc.Inspect(f.ctx, 999); return err },
		"actions": func() error { _, err := f.svc.Actions(f.ctx, 999); return err },
	} {
		if err := call(); !errors.Is(err, recovery.ErrNotFound) {
			t.Errorf("%s: got %v, want ErrNotFound", name, err)
		}
	}
	if n := f.count(`SELECT count(*) FROM recovery_actions`); n != 0 {
		t.Fatalf("%d actions recorded", n)
	}
}
