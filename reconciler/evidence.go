package reconciler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// WindowView is the summary window an outbox item's meter event timestamp
// falls in, as the last run that looked at it saw it.
type WindowView struct {
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
	Committed float64   `json:"committed"`
	// Observed is Stripe's summary; nil when not compared.
	Observed   *float64  `json:"observed"`
	Settled    bool      `json:"settled"`
	Matched    bool      `json:"matched"`
	ComparedAt time.Time `json:"compared_at"`
}

// ItemEvidence is what the reconciler knows of one outbox item, for
// `auroractl recovery inspect`: its window (settled or not, matched or
// not) and the reconciliation items naming it.
type ItemEvidence struct {
	// Window is nil when no run has looked at the item's window yet.
	Window *WindowView `json:"window"`
	// Status is one line: "confirmed", "settled and matched", "not settled
	// yet (…)", "settled, does not match (…)", "not compared yet".
	Status string `json:"status"`
	Items  []Item `json:"reconciliation_items"`
}

// Evidence returns what the reconciler knows of outbox item id. An item
// whose window has not settled must not be abandoned on the grounds that
// Stripe does not show it.
func Evidence(ctx context.Context, q Querier, id int64) (ItemEvidence, error) {
	var (
		account, state string
		occurred       time.Time
		customer       *string
		meter          *string
	)
	err := q.QueryRow(ctx, `SELECT o.destination_account, o.state, o.occurred_at, tb.stripe_customer, m.meter_id
		FROM outbox_items o
		LEFT JOIN tenant_billing tb ON tb.tenant = o.tenant AND tb.destination_account = o.destination_account
		LEFT JOIN meter_mappings m ON m.destination_account = o.destination_account AND m.feature = o.feature
		WHERE o.id = $1`, id).Scan(&account, &state, &occurred, &customer, &meter)
	if errors.Is(err, pgx.ErrNoRows) {
		return ItemEvidence{}, fmt.Errorf("%w: outbox item %d", ErrNotFound, id)
	}
	if err != nil {
		return ItemEvidence{}, fmt.Errorf("reconciler: evidence: %w", err)
	}
	ev := ItemEvidence{Status: "not compared yet: no reconciler run has looked at its window"}
	if ev.Items, err = ItemsNaming(ctx, q, id); err != nil {
		return ItemEvidence{}, err
	}
	if customer != nil && meter != nil {
		var w WindowView
		err := q.QueryRow(ctx, `SELECT window_start, window_end, committed::float8, observed::float8, settled, matched, compared_at
			FROM reconciliation_windows
			WHERE destination_account = $1 AND stripe_customer = $2 AND meter_id = $3 AND window_start <= $4 AND window_end > $4
			ORDER BY window_start DESC LIMIT 1`, account, *customer, *meter, occurred).
			Scan(&w.Start, &w.End, &w.Committed, &w.Observed, &w.Settled, &w.Matched, &w.ComparedAt)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return ItemEvidence{}, fmt.Errorf("reconciler: evidence: %w", err)
		default:
			w.Start, w.End, w.ComparedAt = w.Start.UTC(), w.End.UTC(), w.ComparedAt.UTC()
			ev.Window = &w
			switch {
			case !w.Settled:
				ev.Status = fmt.Sprintf("not settled yet (window [%s, %s) compared %s): Stripe's summaries may not show it yet; do not abandon on that ground",
					w.Start.Format(time.RFC3339), w.End.Format(time.RFC3339), w.ComparedAt.Format(time.RFC3339))
			case w.Matched:
				ev.Status = "settled and matched"
			default:
				ev.Status = fmt.Sprintf("settled, does not match (committed %s, Stripe %s)", fmtQty(w.Committed), fmtQty(deref64(w.Observed)))
			}
		}
	}
	if state == "confirmed" {
		ev.Status = "confirmed: a settled summary window covered it"
	}
	return ev, nil
}

func deref64(f *float64) float64 {
	if f == nil {
		return 0
	}
	return *f
}
