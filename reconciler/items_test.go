package reconciler

import (
	"errors"
	"testing"
	"time"
)

func TestRecordSameDifferenceAddsNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	now := time.Date(2026, 9, 2, 0, 0, 0, 0, time.UTC)
	exp, obs := 10.0, 7.0
	fd := Finding{Kind: KindSummaryShortfall, Fingerprint: "summary_shortfall|a|c|m|h", Detail: "d", Expected: &exp, Observed: &obs, ItemIDs: []int64{3, 1}}
	rec := func(fd Finding) upsertResult {
		tx, err := f.pool.Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(f.ctx) //nolint:errcheck
		res, err := record(f.ctx, tx, fd, &now)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
		return res
	}
	if got := rec(fd); got != upsertInserted {
		t.Fatalf("first: %v", got)
	}
	if got := rec(fd); got != upsertUnchanged {
		t.Fatalf("second: %v", got)
	}
	obs2 := 8.0
	fd.Observed = &obs2
	if got := rec(fd); got != upsertUpdated {
		t.Fatalf("changed: %v", got)
	}
	items, err := ListItems(f.ctx, f.pool, StateOpen, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 1 || *items[0].Observed != 8 || items[0].ObservedChangedAt == nil || len(items[0].ItemIDs) != 2 || items[0].ItemIDs[0] != 1 {
		t.Fatalf("items: %+v", items)
	}
}

func TestResolve(t *testing.T) {
	t.Parallel()
	period := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		in         ResolveInput
		resolved   bool // item already resolved
		wantErr    error
		wantAction bool // a recovery_actions row is written
	}{
		{"applied", ResolveInput{Resolution: "credited manually, see invoice in_123", Actor: "liam", Evidence: "cn_1"}, false, nil, true},
		{"blank resolution", ResolveInput{Resolution: "", Actor: "liam"}, false, ErrInvalidResolution, true},
		{"whitespace resolution", ResolveInput{Resolution: " \t\n", Actor: "liam"}, false, ErrInvalidResolution, true},
		{"blank actor", ResolveInput{Resolution: "done", Actor: " "}, false, ErrInvalidActor, true},
		{"already resolved", ResolveInput{Resolution: "again", Actor: "liam"}, true, ErrAlreadyResolved, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			itemID := f.item("t1", "event", "event:e1", "api_calls", 3, period, "accepted")
			f.exec(`INSERT INTO usage_counters (tenant, feature, period_start, count) VALUES ('t1', 'api_calls', $1, 3)`, period)
			var id int64
			if err := f.pool.QueryRow(f.ctx, `INSERT INTO reconciliation_items (kind, fingerprint, detail, outbox_item_ids) VALUES ('async_rejection', 'fp', 'd', ARRAY[$1::bigint]) RETURNING id`, itemID).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if tt.resolved {
				f.exec(`UPDATE reconciliation_items SET state = 'resolved', resolution = 'first', resolved_by = 'ana', resolved_at = now() WHERE id = $1`, id)
			}
			snapshot := func() string {
				var s string
				if err := f.pool.QueryRow(f.ctx, `SELECT (SELECT string_agg(id || state || lease_token || quantity, ',') FROM outbox_items) ||
					(SELECT string_agg(count::text, ',') FROM usage_counters)`).Scan(&s); err != nil {
					t.Fatal(err)
				}
				return s
			}
			before := snapshot()
			if _, err := PreviewResolve(f.ctx, f.pool, id, tt.in); !errors.Is(err, tt.wantErr) && !(tt.wantErr == nil && err == nil) {
				t.Fatalf("preview: %v", err)
			}
			if n := f.count(`SELECT count(*) FROM recovery_actions`); n != 0 {
				t.Fatal("preview wrote an action")
			}
			res, err := Resolve(f.ctx, f.pool, id, tt.in, nil)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if res.Item.State != StateResolved || *res.Item.ResolvedBy != "liam" || res.Change == nil {
					t.Fatalf("result: %+v", res)
				}
			} else if !errors.Is(err, tt.wantErr) {
				t.Fatalf("want %v, got %v", tt.wantErr, err)
			}
			if tt.wantErr == ErrInvalidResolution && RefusalOf(err) != RefusalInvalidResolution {
				t.Fatalf("refusal atom %q", RefusalOf(err))
			}
			if n := f.count(`SELECT count(*) FROM recovery_actions WHERE action = $1 AND (subject->>'reconciliation_item_id')::bigint = $2 AND applied = $3`,
				ActionResolve, id, tt.wantErr == nil); (n == 1) != tt.wantAction {
				t.Fatalf("actions recorded: %d", n)
			}
			if after := snapshot(); after != before {
				t.Fatalf("resolve changed the ledger: %s -> %s", before, after)
			}
		})
	}
	t.Run("not found", func(t *testing.T) {
		f := newFixture(t)
		if _, err := Resolve(f.ctx, f.pool, 999, ResolveInput{Resolution: "x", Actor: "y"}, nil); !errors.Is(err, ErrNotFound) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestListItemsRefusesBadQuery(t *testing.T) {
	f := newFixture(t)
	if _, err := ListItems(f.ctx, f.pool, "closed", 10); !errors.Is(err, ErrInvalidQuery) {
		t.Fatalf("state: %v", err)
	}
	if _, err := ListItems(f.ctx, f.pool, StateOpen, 0); !errors.Is(err, ErrInvalidQuery) {
		t.Fatalf("limit: %v", err)
	}
}
