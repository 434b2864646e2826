package reconciler

import (
	"testing"
	"time"
)

func TestLocalDriftRules(t *testing.T) {
	t.Parallel()
	period := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		setup    func(f *fixture) []int64
		wantRule DriftRule // "" = no drift
	}{
		{"acknowledged within counter", func(f *fixture) []int64 {
			f.exec(`INSERT INTO usage_counters (tenant, feature, period_start, count) VALUES ('t1', 'api_calls', $1, 5)`, period)
			f.exec(`INSERT INTO usage_windows (tenant, feature, period_start, acknowledged_to) VALUES ('t1', 'api_calls', $1, 5)`, period)
			return nil
		}, ""},
		{"acknowledged above counter", func(f *fixture) []int64 {
			f.exec(`INSERT INTO usage_counters (tenant, feature, period_start, count) VALUES ('t1', 'api_calls', $1, 4)`, period)
			f.exec(`INSERT INTO usage_windows (tenant, feature, period_start, acknowledged_to) VALUES ('t1', 'api_calls', $1, 5)`, period)
			return nil
		}, DriftWindowAcknowledged},
		{"acknowledged without a counter", func(f *fixture) []int64 {
			f.exec(`INSERT INTO usage_windows (tenant, feature, period_start, acknowledged_to) VALUES ('t1', 'api_calls', $1, 1)`, period)
			return nil
		}, DriftWindowAcknowledged},
		{"staged window above counter", func(f *fixture) []int64 {
			f.exec(`INSERT INTO usage_counters (tenant, feature, period_start, count) VALUES ('t1', 'api_calls', $1, 3)`, period)
			return []int64{f.item("t1", "usage_window", "usage:api_calls:2026-09-01T00:00:00Z:0:5", "api_calls", 5, period, "accepted")}
		}, DriftWindowStaged},
		{"rejected window above counter is not a claim", func(f *fixture) []int64 {
			f.exec(`INSERT INTO usage_counters (tenant, feature, period_start, count) VALUES ('t1', 'api_calls', $1, 3)`, period)
			f.item("t1", "usage_window", "usage:api_calls:2026-09-01T00:00:00Z:0:5", "api_calls", 5, period, "rejected")
			return nil
		}, ""},
		{"event item above event", func(f *fixture) []int64 {
			id := f.item("t1", "event", "event:e1", "api_calls", 9, period, "accepted")
			f.exec(`INSERT INTO usage_events (tenant, event_id, kind, feature, quantity, occurred_at, item_id) VALUES ('t1', 'e1', 'event', 'api_calls', 2, $1, $2)`, period, id)
			return []int64{id}
		}, DriftEventItem},
		{"event accepted twice under two identities", func(f *fixture) []int64 {
			a := f.item("t1", "event", "event:e1", "api_calls", 1, period, "accepted")
			b := f.item("t1", "event", "event:e1:r1", "api_calls", 1, period, "confirmed")
			return []int64{a, b}
		}, DriftEventTwice},
		{"restaged after a rejection", func(f *fixture) []int64 {
			f.item("t1", "event", "event:e1", "api_calls", 1, period, "rejected")
			f.item("t1", "event", "event:e1:r1", "api_calls", 1, period, "accepted")
			return nil
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			ids := tt.setup(f)
			f.exec(`INSERT INTO reconciliation_items (kind, fingerprint, detail) VALUES ('summary_shortfall', 'fp1', 'x')`)
			before := f.count(`SELECT count(*) FROM outbox_items WHERE state = 'confirmed'`)
			rep, err := Local(f.ctx, f.pool)
			if err != nil {
				t.Fatal(err)
			}
			if rep.ItemsOpen != 1 {
				t.Fatalf("items_open = %d, want 1", rep.ItemsOpen)
			}
			if len(rep.BlindSpots) != 3 {
				t.Fatalf("blind spots: %v", rep.BlindSpots)
			}
			if tt.wantRule == "" {
				if len(rep.LocalDrift) != 0 {
					t.Fatalf("want no drift, got %+v", rep.LocalDrift)
				}
				return
			}
			if len(rep.LocalDrift) != 1 || rep.LocalDrift[0].Rule != tt.wantRule {
				t.Fatalf("want one %s, got %+v", tt.wantRule, rep.LocalDrift)
			}
			if ids != nil && len(rep.LocalDrift[0].ItemIDs) != len(ids) {
				t.Fatalf("item ids %v, want %v", rep.LocalDrift[0].ItemIDs, ids)
			}
			if after := f.count(`SELECT count(*) FROM outbox_items WHERE state = 'confirmed'`); after != before {
				t.Fatal("Local changed an item")
			}
		})
	}
}
