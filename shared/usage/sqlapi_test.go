package usage_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var sqlSettings = usage.SQLSettings{
	DestinationAccount: "acct_1Test", Mode: identity.ModeTest, Period: usage.PeriodDay,
	Sources: usage.Sources{"api_calls": usage.SourceEvents, "egress_bytes": usage.SourceEvents},
}

// outcome is what a recording call came to, comparable between the Go
// recorder and the SQL API: the refusal's class and field, or the staged
// item.
type outcome struct {
	Refusal string // "" when recorded
	Key     string
	State   outbox.State
	Reason  string
	Created bool
}

func refusalOf(err error) string {
	var fe *usage.FieldError
	var ofe *outbox.FieldError
	var ace *usage.AlreadyCancelledError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &fe):
		return "invalid_event:" + fe.Field
	case errors.As(err, &ofe):
		return "invalid_item:" + ofe.Field
	case errors.As(err, &ace):
		return "already_cancelled:" + ace.CancelledBy
	case errors.Is(err, usage.ErrEventConflict):
		return "event_conflict"
	case errors.Is(err, usage.ErrCorrectedUnknown):
		return "corrected_event_unknown"
	case errors.Is(err, usage.ErrCorrectionExceeds):
		return "correction_exceeds_value"
	case errors.Is(err, outbox.ErrPayloadConflict):
		return "payload_conflict"
	case errors.Is(err, usage.ErrNotConfigured):
		return "not_configured"
	}
	return "other: " + err.Error()
}

func reasonString(r *outbox.Reason) string {
	if r == nil {
		return ""
	}
	return string(*r)
}

// TestSQLAPIRefusesAsTheGoRecorder records the same input through
// usage.Gate.Record and through aurora.record_usage(_correction) on the same
// committed state, each in its own rolled-back transaction, and requires the
// same outcome: the same refusal (class and field), or the same item (key,
// state, reason, created). A rule changed on one side only fails here.
func TestSQLAPIRefusesAsTheGoRecorder(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 9, 1, 10, 0, 0, 0, time.UTC)
	ev := func(id string, q int64) usage.Event {
		return usage.Event{Tenant: "org_1", EventID: id, Feature: "api_calls", Quantity: q, OccurredAt: day}
	}
	corr := func(id, of string, q int64) usage.Event {
		e := ev(id, q)
		e.CorrectsEventID = of
		return e
	}
	with := func(e usage.Event, f func(*usage.Event)) usage.Event { f(&e); return e }
	prior := func(events ...usage.Event) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			for _, e := range events {
				if _, _, err := sqlSettings.Gate().Record(ctx, tx, e); err != nil {
					return err
				}
			}
			return nil
		}
	}
	exec := func(sql string, args ...any) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, sql, args...); return err }
	}
	cases := []struct {
		name   string
		setup  func(context.Context, pgx.Tx) error
		cfg    *usage.SQLSettings // nil = sqlSettings
		in     usage.Event
		expect string // the refusal both must give ("" = recorded)
	}{
		{name: "event recorded pending", in: ev("e1", 3)},
		{name: "zero quantity event", in: ev("e1", 0)},
		{name: "feature that counts is buffered", in: with(ev("e1", 3), func(e *usage.Event) { e.Feature = "storage_gb" })},
		{name: "period before the watermark is buffered", in: ev("e1", 3),
			setup: exec(`INSERT INTO usage_cutovers (tenant, feature, watermark, scheduled_by) VALUES ('', 'api_calls', '2026-10-01T00:00:00Z', 't')`)},
		{name: "tenant watermark over the all-tenants one", in: with(ev("e1", 3), func(e *usage.Event) { e.Feature = "storage_gb" }),
			setup: exec(`INSERT INTO usage_cutovers (tenant, feature, watermark, scheduled_by) VALUES ('', 'storage_gb', '2026-10-01T00:00:00Z', 't'), ('org_1', 'storage_gb', '2026-08-01T00:00:00Z', 't')`)},
		{name: "mapped feature", in: ev("e1", 3), setup: exec(`
			INSERT INTO stripe_accounts (account_id, mode, confirmed) VALUES ('acct_1Test', 'test', true);
			INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name, mapping_version) VALUES ('acct_1Test', 'api_calls', 'mtr_1', 'api_calls', 3)`)},
		{name: "blank tenant", in: with(ev("e1", 3), func(e *usage.Event) { e.Tenant = " \t" }), expect: "invalid_event:tenant"},
		{name: "tenant of unicode spaces", in: with(ev("e1", 3), func(e *usage.Event) { e.Tenant = "\u00a0\u3000\u2028" }), expect: "invalid_event:tenant"},
		{name: "tenant with inner space", in: with(ev("e1", 3), func(e *usage.Event) { e.Tenant = "org 1" })},
		{name: "empty event id", in: ev("", 3), expect: "invalid_event:event_id"},
		{name: "empty feature", in: with(ev("e1", 3), func(e *usage.Event) { e.Feature = "" }), expect: "invalid_event:feature"},
		{name: "zero time", in: with(ev("e1", 3), func(e *usage.Event) { e.OccurredAt = time.Time{} }), expect: "invalid_event:occurred_at"},
		{name: "negative event", in: ev("e1", -1), expect: "invalid_event:quantity"},
		{name: "correction of itself", in: corr("e1", "e1", 1), expect: "invalid_event:corrects_event_id"},
		{name: "tenant of 255 bytes", in: with(ev("e1", 3), func(e *usage.Event) { e.Tenant = strings.Repeat("t", 255) })},
		{name: "tenant over 255 bytes", in: with(ev("e1", 3), func(e *usage.Event) { e.Tenant = strings.Repeat("é", 128) }), expect: "invalid_event:tenant"},
		{name: "event id over 255 bytes", in: ev(strings.Repeat("e", 256), 3), expect: "invalid_event:event_id"},
		{name: "tenant with a control character", in: with(ev("e1", 3), func(e *usage.Event) { e.Tenant = "org\x1b[31m" }), expect: "invalid_event:tenant"},
		{name: "tenant with a C1 control", in: with(ev("e1", 3), func(e *usage.Event) { e.Tenant = "org\u0085x" }), expect: "invalid_event:tenant"},
		{name: "event id with U+FFFD", in: ev("e\ufffd1", 3), expect: "invalid_event:event_id"},
		{name: "event id with a tab", in: ev("e\t1", 3), expect: "invalid_event:event_id"},
		{name: "feature with a space", in: with(ev("e1", 3), func(e *usage.Event) { e.Feature = "api calls" }), expect: "invalid_event:feature"},
		{name: "blank feature", in: with(ev("e1", 3), func(e *usage.Event) { e.Feature = " " }), expect: "invalid_event:feature"},
		{name: "feature starting with a dot", in: with(ev("e1", 3), func(e *usage.Event) { e.Feature = ".api" }), expect: "invalid_event:feature"},
		{name: "feature of 101 bytes", in: with(ev("e1", 3), func(e *usage.Event) { e.Feature = strings.Repeat("f", 101) }), expect: "invalid_event:feature"},
		{name: "quantity of 15 digits", in: ev("e1", 999_999_999_999_999)},
		{name: "quantity of 16 digits", in: ev("e1", 1_000_000_000_000_000), expect: "invalid_event:quantity"},
		{name: "correction of 16 digits", in: corr("c1", "e1", -1_000_000_000_000_000), setup: prior(ev("e1", 3)), expect: "invalid_event:quantity"},
		{name: "correction naming a control character", in: corr("c1", "e\n1", 1), expect: "invalid_event:corrects_event_id"},
		{name: "destination account over 255 bytes", in: ev("e1", 3), expect: "invalid_item:destination_account",
			cfg: &usage.SQLSettings{DestinationAccount: "acct_" + strings.Repeat("x", 251), Mode: identity.ModeTest, Period: usage.PeriodDay, Sources: sqlSettings.Sources}},
		{name: "hourly periods", in: corr("c1", "e1", 1), expect: "invalid_event:occurred_at",
			setup: exec(`INSERT INTO usage_events (tenant, event_id, kind, feature, quantity, occurred_at) VALUES ('org_1', 'e1', 'event', 'api_calls', 3, '2026-09-01T09:59:00Z')`),
			cfg:   &usage.SQLSettings{DestinationAccount: "acct_1Test", Mode: identity.ModeTest, Period: usage.PeriodHour, Sources: sqlSettings.Sources}},
		{name: "monthly periods", in: with(corr("c1", "e1", 1), func(e *usage.Event) { e.OccurredAt = day.AddDate(0, 0, 20) }),
			setup: exec(`INSERT INTO usage_events (tenant, event_id, kind, feature, quantity, occurred_at) VALUES ('org_1', 'e1', 'event', 'api_calls', 3, '2026-09-01T09:59:00Z')`),
			cfg:   &usage.SQLSettings{DestinationAccount: "acct_1Test", Mode: identity.ModeTest, Period: usage.PeriodMonth, Sources: sqlSettings.Sources}},
		{name: "unicode tenant", in: with(ev("e1", 3), func(e *usage.Event) { e.Tenant = "組織_1" })},
		{name: "same event again", in: ev("e1", 3), setup: prior(ev("e1", 3))},
		{name: "event id reused with another quantity", in: ev("e1", 4), setup: prior(ev("e1", 3)), expect: "event_conflict"},
		{name: "event id reused with another time", in: with(ev("e1", 3), func(e *usage.Event) { e.OccurredAt = day.Add(time.Second) }), setup: prior(ev("e1", 3)), expect: "event_conflict"},
		{name: "event id reused as a correction", in: corr("e1", "e0", 1), setup: prior(ev("e0", 3), ev("e1", 3)), expect: "event_conflict"},
		{name: "positive correction", in: corr("c1", "e1", 2), setup: prior(ev("e1", 3))},
		{name: "negative correction", in: corr("c1", "e1", -3), setup: prior(ev("e1", 3))},
		{name: "correction of an unknown event", in: corr("c1", "nope", -1), expect: "corrected_event_unknown"},
		{name: "correction of zero", in: corr("c1", "e1", 0), setup: prior(ev("e1", 3)), expect: "invalid_event:quantity"},
		{name: "correction of another feature", in: with(corr("c1", "e1", 1), func(e *usage.Event) { e.Feature = "egress_bytes" }), setup: prior(ev("e1", 3)), expect: "invalid_event:feature"},
		{name: "correction in another period", in: with(corr("c1", "e1", 1), func(e *usage.Event) { e.OccurredAt = day.AddDate(0, 0, 1) }), setup: prior(ev("e1", 3)), expect: "invalid_event:occurred_at"},
		{name: "correction removing more than the event", in: corr("c1", "e1", -4), setup: prior(ev("e1", 3)), expect: "correction_exceeds_value"},
		{name: "second cancel of one event", in: corr("c2", "e1", -1), setup: prior(ev("e1", 3), corr("c1", "e1", -1)), expect: "already_cancelled:c1"},
		{name: "correction of the restating correction", in: corr("c2", "c1", -2), setup: prior(ev("e1", 3), corr("c1", "e1", -1))},
		{name: "chain value exceeded", in: corr("c2", "c1", -3), setup: prior(ev("e1", 3), corr("c1", "e1", -1)), expect: "correction_exceeds_value"},
		{name: "same correction again", in: corr("c1", "e1", -1), setup: prior(ev("e1", 3), corr("c1", "e1", -1))},
		{name: "identity staged by hand with another payload", in: ev("e9", 3), expect: "payload_conflict",
			setup: func(ctx context.Context, tx pgx.Tx) error {
				_, err := outbox.Stage(ctx, tx, outbox.Item{Identity: identity.Identity{Tenant: "org_1", SubjectKind: identity.SubjectEvent,
					SubjectRef: "event:e9", Exporter: outbox.DefaultExporter, DestinationAccount: "acct_1Test", Mode: identity.ModeTest},
					Feature: "api_calls", Quantity: 5, OccurredAt: day, PeriodStart: usage.PeriodDay.Start(day)})
				return err
			}},
		{name: "identity staged by hand with the same payload", in: ev("e9", 3),
			setup: func(ctx context.Context, tx pgx.Tx) error {
				_, err := outbox.Stage(ctx, tx, outbox.Item{Identity: identity.Identity{Tenant: "org_1", SubjectKind: identity.SubjectEvent,
					SubjectRef: "event:e9", Exporter: outbox.DefaultExporter, DestinationAccount: "acct_1Test", Mode: identity.ModeTest},
					Feature: "api_calls", Quantity: 3, OccurredAt: day, PeriodStart: usage.PeriodDay.Start(day)})
				return err
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := dbtest.New(t)
			cfg := sqlSettings
			if tc.cfg != nil {
				cfg = *tc.cfg
			}
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := usage.WriteSQLSettings(ctx, tx, cfg, "test"); err != nil {
					return err
				}
				if tc.setup != nil {
					return tc.setup(ctx, tx)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("setup: %v", err)
			}
			var goOut, sqlOut outcome
			var goRow outbox.Row
			_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				row, created, err := cfg.Gate().Record(ctx, tx, tc.in)
				goOut = outcome{Refusal: refusalOf(err)}
				if err == nil {
					goRow = row
					goOut = outcome{Key: row.IdempotencyKey, State: row.State, Reason: reasonString(row.QuarantineReason), Created: created}
				}
				return errors.New("roll back")
			})
			var sqlRow outbox.Row
			_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				res, err := usage.RecordSQL(ctx, tx, tc.in)
				sqlOut = outcome{Refusal: refusalOf(err)}
				if err == nil {
					reason := ""
					if res.QuarantineReason != nil {
						reason = *res.QuarantineReason
					}
					sqlOut = outcome{Key: res.IdempotencyKey, State: res.State, Reason: reason, Created: res.Created}
					if sqlRow, err = outbox.Get(ctx, tx, res.ItemID); err != nil {
						t.Errorf("read the SQL API's item: %v", err)
					}
				}
				return errors.New("roll back")
			})
			if goOut != sqlOut {
				t.Fatalf("Go recorder: %+v\nSQL API:     %+v", goOut, sqlOut)
			}
			if goOut.Refusal != tc.expect {
				t.Fatalf("both gave %q, the case expects %q", goOut.Refusal, tc.expect)
			}
			if tc.expect == "" {
				if goRow.Identity != sqlRow.Identity || !goRow.PeriodStart.Equal(sqlRow.PeriodStart) || goRow.Quantity != sqlRow.Quantity ||
					goRow.Feature != sqlRow.Feature || !goRow.OccurredAt.Equal(sqlRow.OccurredAt) {
					t.Fatalf("items differ:\nGo:  %+v\nSQL: %+v", goRow, sqlRow)
				}
			}
		})
	}
}

// TestSQLAPIErrors pins each refusal's SQLSTATE, the COLUMN of a field
// error and the message's start, as a driver in any language sees them.
func TestSQLAPIErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	day := time.Date(2026, 9, 1, 10, 0, 0, 0, time.UTC)
	call := func(sql string, args ...any) *pgconn.PgError {
		t.Helper()
		var pg *pgconn.PgError
		_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, sql, args...)
			if !errors.As(err, &pg) {
				t.Fatalf("%s: got %v, want a Postgres error", sql, err)
			}
			return err
		})
		return pg
	}
	pg := call(`SELECT aurora.record_usage('org_1', 'e1', 'api_calls', 1, now())`)
	if pg.Code != usage.SQLStateNotConfigured || !errors.Is(usage.FromSQL(pg), usage.ErrNotConfigured) {
		t.Fatalf("unconfigured: %s %s", pg.Code, pg.Message)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := usage.WriteSQLSettings(ctx, tx, sqlSettings, "test"); err != nil {
			return err
		}
		_, _, err := sqlSettings.Gate().Record(ctx, tx, usage.Event{Tenant: "org_1", EventID: "e1", Feature: "api_calls", Quantity: 3, OccurredAt: day})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sql     string
		args    []any
		code    string
		column  string
		message string
		is      error
	}{
		{`SELECT aurora.record_usage(NULL, 'e1', 'api_calls', 1, now())`, nil, usage.SQLStateInvalidEvent, "tenant", "usage: invalid tenant: must not be empty", usage.ErrInvalidEvent},
		{`SELECT aurora.record_usage('org_1', 'e2', 'api_calls', NULL, now())`, nil, usage.SQLStateInvalidEvent, "quantity", "usage: invalid quantity: must be set", usage.ErrInvalidEvent},
		{`SELECT aurora.record_usage('org_1', 'e2', 'api_calls', 1, 'infinity')`, nil, usage.SQLStateInvalidEvent, "occurred_at", "usage: invalid occurred_at: must be a finite time", usage.ErrInvalidEvent},
		{`SELECT aurora.record_usage_correction('org_1', 'c1', '', 'api_calls', 1, $1)`, []any{day}, usage.SQLStateInvalidEvent, "corrects_event_id", "usage: invalid corrects_event_id: must not be empty for a correction", usage.ErrInvalidEvent},
		{`SELECT aurora.record_usage('org_1', 'e1', 'api_calls', 4, $1)`, []any{day}, usage.SQLStateEventConflict, "", "usage: event_conflict: ", usage.ErrEventConflict},
		{`SELECT aurora.record_usage_correction('org_1', 'c1', 'nope', 'api_calls', 1, $1)`, []any{day}, usage.SQLStateCorrectedUnknown, "", "usage: corrected_event_unknown: ", usage.ErrCorrectedUnknown},
		{`SELECT aurora.record_usage_correction('org_1', 'c1', 'e1', 'api_calls', -4, $1)`, []any{day}, usage.SQLStateCorrectionExceeds, "", "usage: correction_exceeds_value: ", usage.ErrCorrectionExceeds},
		{`SELECT aurora.record_usage(repeat('t', 256), 'e1', 'api_calls', 1, $1)`, []any{day}, usage.SQLStateInvalidEvent, "tenant", "usage: invalid tenant: is 256 bytes, longer than 255", usage.ErrInvalidEvent},
	} {
		pg := call(tc.sql, tc.args...)
		if pg.Code != tc.code || pg.ColumnName != tc.column || !strings.HasPrefix(pg.Message, tc.message) {
			t.Errorf("%s:\n got %s column=%q %q\nwant %s column=%q %q…", tc.sql, pg.Code, pg.ColumnName, pg.Message, tc.code, tc.column, tc.message)
		}
		if !errors.Is(usage.FromSQL(pg), tc.is) {
			t.Errorf("%s: FromSQL does not wrap %v", tc.sql, tc.is)
		}
	}
}
