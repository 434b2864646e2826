package usage_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var oct1 = time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)

func gateRecord(t *testing.T, pool *pgxpool.Pool, g usage.Gate, ev usage.Event) (outbox.Row, error) {
	t.Helper()
	ctx := context.Background()
	var row outbox.Row
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		row, _, err = g.Record(ctx, tx, ev)
		return err
	})
	return row, err
}

func TestParseSources(t *testing.T) {
	t.Parallel()
	good := map[string]string{
		"":                                      "",
		"api_calls:events":                      "api_calls:events",
		" api_calls : events , egress:counters": "api_calls:events,egress:counters",
	}
	for in, want := range good {
		s, err := usage.ParseSources(in)
		if err != nil || s.String() != want {
			t.Errorf("ParseSources(%q) = %q, %v", in, s.String(), err)
		}
	}
	for _, bad := range []string{"api_calls", "api_calls:stream", ":events", "a b:events", "x:events,x:counters", "api_calls:events,"} {
		if _, err := usage.ParseSources(bad); !errors.Is(err, usage.ErrInvalidSources) {
			t.Errorf("ParseSources(%q): got %v", bad, err)
		}
	}
	var none usage.Sources
	if none.Of("api_calls") != usage.SourceCounters {
		t.Error("an unlisted feature must count")
	}
}

func TestEraOf(t *testing.T) {
	t.Parallel()
	w := usage.Watermark{Feature: "api_calls", At: oct1, Version: 1}
	tests := []struct {
		period    time.Time
		scheduled bool
		src       usage.Source
		want      usage.Era
	}{
		{oct1.AddDate(0, 0, -1), true, usage.SourceEvents, usage.EraBuffered},
		{oct1, true, usage.SourceCounters, usage.EraRecording},
		{oct1.AddDate(0, 0, 1), true, usage.SourceCounters, usage.EraRecording},
		{oct1, false, usage.SourceCounters, usage.EraBuffered},
		{oct1, false, usage.SourceEvents, usage.EraRecording},
	}
	for _, tt := range tests {
		if got := usage.EraOf(tt.period, w, tt.scheduled, tt.src); got != tt.want {
			t.Errorf("EraOf(%v, scheduled=%v, %s) = %s, want %s", tt.period, tt.scheduled, tt.src, got, tt.want)
		}
	}
}

func TestGateQuarantinesBufferedEraEvents(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	g := usage.Gate{Recorder: rec}
	ev := func(id string, at time.Time) usage.Event {
		return usage.Event{Tenant: "org_123", EventID: id, Feature: "api_calls", Quantity: 2, OccurredAt: at}
	}
	// No watermark and the feature counts: every period is buffered.
	row, err := gateRecord(t, pool, g, ev("e-0", oct1.Add(time.Hour)))
	if err != nil || row.State != outbox.StateQuarantined || *row.QuarantineReason != outbox.ReasonPeriodBuffered {
		t.Fatalf("no watermark, counters: %+v %v", row, err)
	}
	// No watermark and the feature records: accepted.
	row, err = gateRecord(t, pool, usage.Gate{Recorder: rec, Sources: usage.Sources{"api_calls": usage.SourceEvents}}, ev("e-1", oct1.Add(time.Hour)))
	if err != nil || row.State != outbox.StatePending {
		t.Fatalf("no watermark, events: %+v %v", row, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO usage_cutovers (tenant, feature, watermark, scheduled_by) VALUES ('', 'api_calls', $1, 'test')`, oct1); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		id    string
		at    time.Time
		state outbox.State
	}{
		{"e-2", oct1.Add(-time.Second), outbox.StateQuarantined},
		{"e-3", oct1, outbox.StatePending},
		{"e-4", oct1.AddDate(0, 0, 3), outbox.StatePending},
	}
	for _, tt := range tests {
		row, err := gateRecord(t, pool, g, ev(tt.id, tt.at))
		if err != nil || row.State != tt.state {
			t.Fatalf("%s at %v: %s %v, want %s", tt.id, tt.at, row.State, err, tt.state)
		}
	}
	// Recording again returns the first item, quarantined or not.
	row, err = gateRecord(t, pool, g, ev("e-0", oct1.Add(time.Hour)))
	if err != nil || row.State != outbox.StateQuarantined {
		t.Fatalf("re-record: %+v %v", row, err)
	}
}

func TestGateChecksCorrections(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	g := usage.Gate{Recorder: rec, Sources: usage.Sources{"api_calls": usage.SourceEvents}}
	at := oct1.Add(3 * time.Hour)
	base := usage.Event{Tenant: "org_123", EventID: "e-1", Feature: "api_calls", Quantity: 10, OccurredAt: at}
	if _, err := gateRecord(t, pool, g, base); err != nil {
		t.Fatal(err)
	}
	corr := func(id, corrects string, q int64) usage.Event {
		return usage.Event{Tenant: "org_123", EventID: id, Feature: "api_calls", Quantity: q, OccurredAt: at.Add(time.Hour), CorrectsEventID: corrects}
	}
	var fe *usage.FieldError
	if _, err := gateRecord(t, pool, g, corr("c-0", "missing", -1)); !errors.Is(err, usage.ErrCorrectedUnknown) {
		t.Fatalf("unknown: %v", err)
	}
	if _, err := gateRecord(t, pool, g, corr("c-0", "e-1", 0)); !errors.As(err, &fe) || fe.Field != "quantity" {
		t.Fatalf("zero: %v", err)
	}
	other := corr("c-0", "e-1", -1)
	other.OccurredAt = at.AddDate(0, 0, 1)
	if _, err := gateRecord(t, pool, g, other); !errors.As(err, &fe) || fe.Field != "occurred_at" {
		t.Fatalf("other period: %v", err)
	}
	if _, err := gateRecord(t, pool, g, corr("c-0", "e-1", -11)); !errors.Is(err, usage.ErrCorrectionExceeds) {
		t.Fatalf("exceeds: %v", err)
	}
	if _, err := gateRecord(t, pool, g, corr("c-1", "e-1", -4)); err != nil {
		t.Fatal(err)
	}
	// Recording the same correction again is idempotent, not a conflict with itself.
	if _, err := gateRecord(t, pool, g, corr("c-1", "e-1", -4)); err != nil {
		t.Fatal(err)
	}
	_, err := gateRecord(t, pool, g, corr("c-2", "e-1", -1))
	var ac *usage.AlreadyCancelledError
	if !errors.Is(err, usage.ErrAlreadyCancelled) || !errors.As(err, &ac) || ac.CancelledBy != "c-1" {
		t.Fatalf("second cancel of e-1: %v", err)
	}
	// Correct the restatement instead: c-1 carries 6 at Stripe.
	if _, err := gateRecord(t, pool, g, corr("c-2", "c-1", -7)); !errors.Is(err, usage.ErrCorrectionExceeds) {
		t.Fatalf("exceeds the restatement: %v", err)
	}
	if _, err := gateRecord(t, pool, g, corr("c-2", "c-1", -6)); err != nil {
		t.Fatal(err)
	}
	// Positive corrections compensate and never conflict.
	if _, err := gateRecord(t, pool, g, corr("c-3", "e-1", 5)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for id, want := range map[string]int64{"e-1": 10, "c-1": 6, "c-2": 0, "c-3": 5} {
		if v, err := usage.ValueAtStripe(ctx, pool, "org_123", id); err != nil || v != want {
			t.Errorf("ValueAtStripe(%s) = %d %v, want %d", id, v, err, want)
		}
	}
}
