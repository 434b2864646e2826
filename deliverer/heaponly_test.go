package deliverer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// TestClaimAndOutcomeAreHeapOnly: the claim (pending → leased) and each
// outcome write are heap-only updates of outbox_items — no index of the
// table reads a column they change (migration 00311). Postgres counts a
// transaction's own updates and heap-only updates per table
// (pg_stat_get_xact_tuples_updated / _hot_updated); both statements run in
// a transaction of their own, as the deliverer runs them.
func TestClaimAndOutcomeAreHeapOnly(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		outcome Outcome
		reason  outbox.Reason
	}{
		{"accepted", OutcomeAccepted, ""},
		{"retry", OutcomeRetry, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newStore(t)
			ctx := context.Background()
			var rows []outbox.Row
			for i := range 5 {
				rows = append(rows, f.stage(fmt.Sprintf("event:hot:%d", i)))
			}
			// inTx runs fn in a transaction and returns its updates of
			// outbox_items: all, heap-only.
			inTx := func(fn func(tx pgx.Tx)) (updated, hot int64) {
				t.Helper()
				err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
					fn(tx)
					return tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_updated('outbox_items'::regclass),
					       pg_stat_get_xact_tuples_hot_updated('outbox_items'::regclass)`).Scan(&updated, &hot)
				})
				if err != nil {
					t.Fatal(err)
				}
				return updated, hot
			}
			p := claimParams{Now: &f.now, Exporter: outbox.DefaultExporter, Lease: time.Minute}
			for _, r := range rows {
				p.Items = append(p.Items, claimRequest{ItemID: r.ID, Dispatch: r.Dispatch, Key: r.IdempotencyKey})
			}
			var claimed []claimResult
			updated, hot := inTx(func(tx pgx.Tx) {
				var err error
				if claimed, err = claimItems(ctx, tx, p); err != nil {
					t.Fatal(err)
				}
			})
			if updated != int64(len(rows)) || hot != updated {
				t.Fatalf("claim: %d updates, %d heap-only; want %d, all heap-only", updated, hot, len(rows))
			}
			var recs []record
			for _, r := range claimed {
				if r.Verdict != verdictClaimed {
					t.Fatalf("claim verdict %v", r.Verdict)
				}
				recs = append(recs, record{Item: r.Item, Outcome: c.outcome, Reason: c.reason, RetryDelay: time.Second})
			}
			updated, hot = inTx(func(tx pgx.Tx) {
				errs, err := recordOutcomes(ctx, tx, recordParams{Now: &f.now, Records: recs})
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range errs {
					if e != nil {
						t.Fatal(e)
					}
				}
			})
			// A retry updates each row twice (the outcome, then its new
			// dispatch's wake-up); what matters is that none leaves its page.
			if updated < int64(len(rows)) || hot != updated {
				t.Fatalf("outcome %s: %d updates, %d heap-only; want at least %d, all heap-only", c.name, updated, hot, len(rows))
			}
			if got := f.get(rows[0].ID); got.State != c.outcome.nextState() {
				t.Fatalf("state %s, want %s", got.State, c.outcome.nextState())
			}
		})
	}
}
