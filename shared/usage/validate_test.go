package usage_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
)

// hostileEvents are events that must be refused at the edge, each with
// the field the *FieldError names.
func hostileEvents() []struct {
	name, field string
	ev          usage.Event
} {
	at := time.Date(2026, 9, 1, 10, 0, 0, 0, time.UTC)
	ok := usage.Event{Tenant: "org_1", EventID: "e1", Feature: "api_calls", Quantity: 1, OccurredAt: at}
	with := func(f func(*usage.Event)) usage.Event { e := ok; f(&e); return e }
	return []struct {
		name, field string
		ev          usage.Event
	}{
		{"NUL tenant", "tenant", with(func(e *usage.Event) { e.Tenant = "org_\x00b" })},
		{"300-character tenant", "tenant", with(func(e *usage.Event) { e.Tenant = strings.Repeat("t", 300) })},
		{"invalid UTF-8 tenant", "tenant", with(func(e *usage.Event) { e.Tenant = "org_\xff" })},
		{"replacement character tenant", "tenant", with(func(e *usage.Event) { e.Tenant = "org_\uFFFD" })},
		{"newline tenant", "tenant", with(func(e *usage.Event) { e.Tenant = "org\n1" })},
		{"NUL event id", "event_id", with(func(e *usage.Event) { e.EventID = "e\x00" })},
		{"long event id", "event_id", with(func(e *usage.Event) { e.EventID = strings.Repeat("e", 256) })},
		{"NUL feature", "feature", with(func(e *usage.Event) { e.Feature = "api_calls\x00" })},
		{"feature with a space", "feature", with(func(e *usage.Event) { e.Feature = "api calls" })},
		{"19-digit quantity", "quantity", with(func(e *usage.Event) { e.Quantity = 9223372036854775807 })},
		{"16-digit quantity", "quantity", with(func(e *usage.Event) { e.Quantity = 1_000_000_000_000_000 })},
		{"negative event quantity", "quantity", with(func(e *usage.Event) { e.Quantity = -1 })},
		{"occurred in 1 BC", "occurred_at", with(func(e *usage.Event) { e.OccurredAt = time.Date(0, 1, 1, 0, 0, 0, 0, time.FixedZone("", 3600)) })},
		{"occurred before 1970", "occurred_at", with(func(e *usage.Event) { e.OccurredAt = time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC) })},
		{"16-digit negative correction", "quantity", with(func(e *usage.Event) { e.CorrectsEventID = "e0"; e.Quantity = -1_000_000_000_000_000 })},
		{"NUL corrected id", "corrects_event_id", with(func(e *usage.Event) { e.CorrectsEventID = "e\x00" })},
	}
}

func TestValidateRefusesHostileFieldsNamingThem(t *testing.T) {
	t.Parallel()
	for _, tt := range hostileEvents() {
		err := tt.ev.Validate()
		var fe *usage.FieldError
		if !errors.As(err, &fe) || fe.Field != tt.field || !errors.Is(err, usage.ErrInvalidEvent) {
			t.Errorf("%s: Validate() = %v, want *FieldError for %s", tt.name, err, tt.field)
		}
	}
	at := time.Date(2026, 9, 1, 10, 0, 0, 0, time.UTC)
	for _, ev := range []usage.Event{
		{Tenant: strings.Repeat("t", 255), EventID: strings.Repeat("e", 255), Feature: "api_calls", Quantity: 999_999_999_999_999, OccurredAt: at},
		{Tenant: "org_日本", EventID: "é", Feature: "egress_bytes", Quantity: -999_999_999_999_999, OccurredAt: at, CorrectsEventID: "x"},
	} {
		if err := ev.Validate(); err != nil {
			t.Errorf("at the limits: %v", err)
		}
	}
}

// Every hostile event is refused by Gate.Record with its *FieldError, never
// a Postgres error, and nothing is written.
func TestRecordRefusesHostileEventsBeforePostgres(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	gate := usage.Gate{Recorder: rec, Sources: usage.Sources{"api_calls": usage.SourceEvents}}
	for _, tt := range hostileEvents() {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, _, err := gate.Record(ctx, tx, tt.ev); return err })
		var fe *usage.FieldError
		if !errors.As(err, &fe) || fe.Field != tt.field {
			t.Errorf("%s: Record = %v, want *FieldError for %s", tt.name, err, tt.field)
		}
		if tt.field == "tenant" || tt.field == "feature" || tt.field == "quantity" && tt.ev.CorrectsEventID == "" {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := rec.Increment(ctx, tx, tt.ev.Tenant, tt.ev.Feature, tt.ev.OccurredAt, tt.ev.Quantity)
				return err
			})
			if !errors.As(err, &fe) || fe.Field != tt.field {
				t.Errorf("%s: Increment = %v, want *FieldError for %s", tt.name, err, tt.field)
			}
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM usage_events) + (SELECT count(*) FROM outbox_items) + (SELECT count(*) FROM usage_counters)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows written for refused events", n)
	}
}
