package usage_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func batchGate() usage.Gate {
	return usage.Gate{
		Recorder: usage.Recorder{DestinationAccount: "acct_1Test", Mode: identity.ModeTest, Period: usage.PeriodDay},
		Sources:  usage.Sources{"api_calls": usage.SourceEvents},
	}
}

func recordBatch(t *testing.T, pool *pgxpool.Pool, g usage.Gate, evs []usage.Event) (int, error) {
	t.Helper()
	var n int
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		n, err = g.RecordBatch(context.Background(), tx, evs)
		return err
	})
	return n, err
}

// The batch path must leave exactly what the per-event path leaves.
func TestRecordBatchMatchesRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	var evs []usage.Event
	for i := range 50 {
		evs = append(evs, usage.Event{Tenant: fmt.Sprintf("t%d", i%7), EventID: fmt.Sprintf("e%d", i), Feature: "api_calls", Quantity: int64(i), OccurredAt: at.Add(time.Duration(i) * time.Minute)})
	}
	batchPool, onePool := dbtest.New(t), dbtest.New(t)
	for _, p := range []*pgxpool.Pool{batchPool, onePool} {
		if _, err := p.Exec(ctx, `INSERT INTO stripe_accounts VALUES ('acct_1Test', 'test', true);
			INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name, mapping_version) VALUES ('acct_1Test', 'api_calls', 'm', 'api_calls', 2)`); err != nil {
			t.Fatal(err)
		}
	}
	n, err := recordBatch(t, batchPool, batchGate(), evs)
	if err != nil || n != 50 {
		t.Fatalf("batch: %d %v", n, err)
	}
	err = pgx.BeginFunc(ctx, onePool, func(tx pgx.Tx) error {
		for _, ev := range evs {
			if _, _, err := batchGate().Record(ctx, tx, ev); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	dump := func(p *pgxpool.Pool) string {
		var s string
		err := p.QueryRow(ctx, `SELECT string_agg(format('%s|%s|%s|%s|%s|%s|%s|%s|%s|%s', i.tenant, i.subject_ref, i.idempotency_key, i.mapping_version,
			i.quantity, i.occurred_at, i.period_start, i.state, u.event_id, u.item_id IS NOT NULL), ';' ORDER BY i.subject_ref)
			FROM outbox_items i JOIN usage_events u ON u.item_id = i.id`).Scan(&s)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if a, b := dump(batchPool), dump(onePool); a != b {
		t.Fatalf("batch and per-event paths differ:\n%s\n%s", a, b)
	}
}

func TestRecordBatchRepeatsDuplicatesAndConflicts(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	at := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	ev := usage.Event{Tenant: "t", EventID: "e1", Feature: "api_calls", Quantity: 1, OccurredAt: at}
	// The same event twice in one batch, then again in a second batch.
	if n, err := recordBatch(t, pool, batchGate(), []usage.Event{ev, ev}); err != nil || n != 1 {
		t.Fatalf("first: %d %v", n, err)
	}
	if n, err := recordBatch(t, pool, batchGate(), []usage.Event{ev}); err != nil || n != 0 {
		t.Fatalf("repeat: %d %v", n, err)
	}
	changed := ev
	changed.Quantity = 2
	if _, err := recordBatch(t, pool, batchGate(), []usage.Event{changed}); !errors.Is(err, usage.ErrEventConflict) {
		t.Fatalf("conflict: %v", err)
	}
	var items, linked int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM outbox_items), (SELECT count(*) FROM usage_events WHERE item_id IS NOT NULL)`).Scan(&items, &linked); err != nil {
		t.Fatal(err)
	}
	if items != 1 || linked != 1 {
		t.Fatalf("items %d linked %d", items, linked)
	}
	bad := ev
	bad.EventID = ""
	if _, err := recordBatch(t, pool, batchGate(), []usage.Event{bad}); !errors.Is(err, usage.ErrInvalidEvent) {
		t.Fatalf("invalid: %v", err)
	}
}

func TestRecordBatchQuarantinesBufferedPeriods(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO usage_cutovers (tenant, feature, watermark, scheduled_by) VALUES ('', 'api_calls', '2026-11-20T00:00:00Z', 'test')`); err != nil {
		t.Fatal(err)
	}
	before := usage.Event{Tenant: "t", EventID: "old", Feature: "api_calls", Quantity: 1, OccurredAt: time.Date(2026, 11, 19, 23, 0, 0, 0, time.UTC)}
	after := usage.Event{Tenant: "t", EventID: "new", Feature: "api_calls", Quantity: 1, OccurredAt: time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)}
	if _, err := recordBatch(t, pool, batchGate(), []usage.Event{before, after}); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	rows, _ := pool.Query(ctx, `SELECT subject_ref, state || coalesce(':' || quarantine_reason, '') FROM outbox_items`)
	for rows.Next() {
		var ref, st string
		_ = rows.Scan(&ref, &st)
		got[ref] = st
	}
	if got["event:old"] != "quarantined:period_buffered" || got["event:new"] != "pending" {
		t.Fatalf("%v", got)
	}
}

// An event whose identity already has an item (staged by hand, before the
// event was recorded) is linked to that item; the rest of the batch gets
// items of its own, and nothing is left pointing at an unused id. A hand
// staged item with another payload is a conflict and the batch rolls back.
func TestRecordBatchLinksHandStagedItems(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	evs := []usage.Event{
		{Tenant: "t", EventID: "e1", Feature: "api_calls", Quantity: 3, OccurredAt: at},
		{Tenant: "t", EventID: "e2", Feature: "api_calls", Quantity: 4, OccurredAt: at},
	}
	handStage := func(pool *pgxpool.Pool, qty int64) int64 {
		t.Helper()
		var id int64
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			row, err := outbox.Stage(ctx, tx, outbox.Item{
				Identity: identity.Identity{Tenant: "t", SubjectKind: identity.SubjectEvent, SubjectRef: usage.SubjectRef(evs[0]),
					Exporter: outbox.DefaultExporter, DestinationAccount: "acct_1Test", Mode: identity.ModeTest},
				Feature: "api_calls", Quantity: qty, OccurredAt: at, PeriodStart: usage.PeriodDay.Start(at),
			})
			id = row.ID
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}

	pool := dbtest.New(t)
	hand := handStage(pool, 3)
	if n, err := recordBatch(t, pool, batchGate(), evs); err != nil || n != 2 {
		t.Fatalf("batch: %d %v", n, err)
	}
	var e1Item int64
	var items, linked int
	err := pool.QueryRow(ctx, `SELECT (SELECT item_id FROM usage_events WHERE event_id = 'e1'),
		(SELECT count(*) FROM outbox_items),
		(SELECT count(*) FROM usage_events u JOIN outbox_items i ON i.id = u.item_id AND i.subject_ref = 'event:' || u.event_id)`).Scan(&e1Item, &items, &linked)
	if err != nil {
		t.Fatal(err)
	}
	if e1Item != hand || items != 2 || linked != 2 {
		t.Fatalf("e1 -> %d (hand-staged %d), items %d, linked %d", e1Item, hand, items, linked)
	}

	other := dbtest.New(t)
	handStage(other, 99)
	if _, err := recordBatch(t, other, batchGate(), evs); !errors.Is(err, outbox.ErrPayloadConflict) {
		t.Fatalf("want ErrPayloadConflict, got %v", err)
	}
	var events int
	if err := other.QueryRow(ctx, `SELECT count(*) FROM usage_events`).Scan(&events); err != nil || events != 0 {
		t.Fatalf("events after a refused batch: %d %v", events, err)
	}
}

// One table of events, each hitting a rule of the staging path (package
// documentation), run through Gate.Record (one transaction per event) on
// one database and through Gate.RecordBatch (one batch; each refusal is
// named by *EventError, dropped, and the rest recorded again) on another:
// both refuse the same events with the same errors and leave the same rows.
func TestRecordAndRecordBatchApplyTheSameRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	old := time.Date(2026, 11, 19, 10, 0, 0, 0, time.UTC) // before tb's watermark: buffered
	ev := func(tenant, id, feature string, q int64, when time.Time, corrects string) usage.Event {
		return usage.Event{Tenant: tenant, EventID: id, Feature: feature, Quantity: q, OccurredAt: when, CorrectsEventID: corrects}
	}
	cases := []struct {
		rule string
		ev   usage.Event
		want error // the refusal (nil: recorded or repeated)
	}{
		{"plain event", ev("t", "e1", "api_calls", 3, at, ""), nil},
		{"zero quantity", ev("t", "e2", "api_calls", 0, at, ""), nil},
		{"repeat", ev("t", "e1", "api_calls", 3, at, ""), nil},
		{"repeat in the same batch, other content", ev("t", "e1", "api_calls", 4, at, ""), usage.ErrEventConflict},
		{"no event id", ev("t", "", "api_calls", 1, at, ""), usage.ErrInvalidEvent},
		{"NUL in tenant", ev("t\x00b", "e3", "api_calls", 1, at, ""), usage.ErrInvalidEvent},
		{"negative event", ev("t", "e4", "api_calls", -1, at, ""), usage.ErrInvalidEvent},
		{"16 digits", ev("t", "e5", "api_calls", 1_000_000_000_000_000, at, ""), usage.ErrInvalidEvent},
		{"buffered period (tenant's watermark)", ev("tb", "old", "api_calls", 1, old, ""), nil},
		{"recorded period (tenant's watermark)", ev("tb", "new", "api_calls", 1, at, ""), nil},
		{"counted feature, no watermark", ev("t", "e6", "egress", 5, at, ""), nil},
		{"unmapped feature", ev("t", "e7", "events_only", 5, at, ""), nil},
		{"identity staged by hand, same payload", ev("t", "h1", "api_calls", 7, at, ""), nil},
		{"identity staged by hand, other payload", ev("t", "h2", "api_calls", 7, at, ""), outbox.ErrPayloadConflict},
		{"positive correction", ev("t", "c1", "api_calls", 2, at, "e1"), nil},
		{"negative correction", ev("t", "c2", "api_calls", -3, at, "e1"), nil},
		{"already cancelled", ev("t", "c3", "api_calls", -1, at, "e1"), usage.ErrAlreadyCancelled},
		{"exceeds", ev("t", "c4", "api_calls", -1, at, "c2"), usage.ErrCorrectionExceeds},
		{"corrects unknown", ev("t", "c5", "api_calls", 1, at, "nope"), usage.ErrCorrectedUnknown},
		{"other feature", ev("t", "c6", "egress", 1, at, "e2"), usage.ErrInvalidEvent},
		{"other period", ev("t", "c7", "api_calls", 1, at.Add(24*time.Hour), "e2"), usage.ErrInvalidEvent},
		{"zero correction", ev("t", "c8", "api_calls", 0, at, "e2"), usage.ErrInvalidEvent},
		{"corrects itself", ev("t", "c9", "api_calls", 1, at, "c9"), usage.ErrInvalidEvent},
		{"correction in a buffered period", ev("tb", "c10", "api_calls", 1, old, "old"), nil},
		{"correction repeated", ev("t", "c1", "api_calls", 2, at, "e1"), nil},
		{"correction repeated, other content", ev("t", "c1", "api_calls", 1, at, "e1"), usage.ErrEventConflict},
	}
	g := usage.Gate{
		Recorder: usage.Recorder{DestinationAccount: "acct_1Test", Mode: identity.ModeTest, Period: usage.PeriodDay},
		Sources:  usage.Sources{"api_calls": usage.SourceEvents, "events_only": usage.SourceEvents},
	}
	setup := func(p *pgxpool.Pool) {
		t.Helper()
		if _, err := p.Exec(ctx, `INSERT INTO stripe_accounts VALUES ('acct_1Test', 'test', true);
			INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name, mapping_version) VALUES
				('acct_1Test', 'api_calls', 'm', 'api_calls', 2), ('acct_1Test', 'egress', 'm2', 'egress', 1);
			INSERT INTO usage_cutovers (tenant, feature, watermark, scheduled_by) VALUES ('tb', 'api_calls', '2026-11-20T00:00:00Z', 'test')`); err != nil {
			t.Fatal(err)
		}
		err := pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
			for _, h := range []struct {
				id string
				q  int64
			}{{"h1", 7}, {"h2", 8}} {
				_, err := outbox.Stage(ctx, tx, outbox.Item{
					Identity: identity.Identity{Tenant: "t", SubjectKind: identity.SubjectEvent, SubjectRef: "event:" + h.id,
						Exporter: outbox.DefaultExporter, DestinationAccount: "acct_1Test", Mode: identity.ModeTest, MappingVersion: 2},
					Feature: "api_calls", Quantity: h.q, OccurredAt: at, PeriodStart: usage.PeriodDay.Start(at),
				})
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	onePool, batchPool := dbtest.New(t), dbtest.New(t)
	setup(onePool)
	setup(batchPool)

	oneErrs := make([]error, len(cases))
	for i, c := range cases {
		oneErrs[i] = pgx.BeginFunc(ctx, onePool, func(tx pgx.Tx) error {
			_, _, err := g.Record(ctx, tx, c.ev)
			return err
		})
	}
	batchErrs := make([]error, len(cases))
	left := make([]int, len(cases)) // indexes of cases still in the batch
	for i := range left {
		left[i] = i
	}
	for range len(cases) + 1 {
		evs := make([]usage.Event, len(left))
		for j, i := range left {
			evs[j] = cases[i].ev
		}
		err := pgx.BeginFunc(ctx, batchPool, func(tx pgx.Tx) error {
			_, err := g.RecordBatch(ctx, tx, evs)
			return err
		})
		if err == nil {
			break
		}
		var ee *usage.EventError
		if !errors.As(err, &ee) || ee.Index < 0 || ee.Index >= len(left) || ee.EventID != evs[ee.Index].EventID {
			t.Fatalf("batch refusal without its event: %v", err)
		}
		batchErrs[left[ee.Index]] = ee.Err
		left = append(left[:ee.Index], left[ee.Index+1:]...)
	}
	for i, c := range cases {
		one, batch := oneErrs[i], batchErrs[i]
		if c.want == nil && (one != nil || batch != nil) || c.want != nil && (!errors.Is(one, c.want) || !errors.Is(batch, c.want)) {
			t.Errorf("%s: Record %v, RecordBatch %v, want %v", c.rule, one, batch, c.want)
		} else if fmt.Sprint(one) != fmt.Sprint(batch) {
			t.Errorf("%s: Record %q, RecordBatch %q", c.rule, one, batch)
		}
	}
	dump := func(p *pgxpool.Pool) string {
		var s string
		err := p.QueryRow(ctx, `SELECT string_agg(format('%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s', u.tenant, u.event_id, u.kind, u.feature, u.quantity,
			u.corrects_event_id, i.subject_ref, i.idempotency_key, i.mapping_version, i.quantity, i.occurred_at, i.period_start, i.state,
			coalesce(i.quarantine_reason, '-')), E'\n' ORDER BY u.tenant, u.event_id)
			|| E'\nitems ' || (SELECT count(*) FROM outbox_items)
			FROM usage_events u LEFT JOIN outbox_items i ON i.id = u.item_id`).Scan(&s)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	one, batch := dump(onePool), dump(batchPool)
	if one != batch {
		t.Fatalf("Record and RecordBatch left different rows:\n%s\n---\n%s", one, batch)
	}
	for _, want := range []string{"tb|old|event|api_calls|1||event:old|", "|quarantined|period_buffered", "t|e7|event|events_only|5||event:e7|"} {
		if !strings.Contains(one, want) {
			t.Errorf("rows lack %q:\n%s", want, one)
		}
	}
}
