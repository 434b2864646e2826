package reconciler

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// ledgerItem is an outbox item as the provider comparison sees it.
type ledgerItem struct {
	ID          int64
	Tenant      string
	Feature     string
	SubjectKind string
	State       string
	Quantity    int64
	OccurredAt  time.Time
	Key         string
	LeaseToken  int64
	Customer    string
	MeterID     string
	// AcceptedAt: when it became accepted (the deliverer's accepted
	// attempt, else an operator's applied acknowledge, else its last
	// update).
	AcceptedAt time.Time
	// TargetID: for a negative correction, the item of the record it
	// corrects (whose meter event it cancels); 0 otherwise.
	TargetID int64
}

// states the comparison loads: everything that may have reached Stripe.
var loadedStates = []string{"pending", "leased", "accepted", "confirmed", "uncertain"}

const ledgerColumns = `o.id, o.tenant, o.feature, o.subject_kind, o.state, o.quantity, o.occurred_at, o.idempotency_key, o.lease_token,
	coalesce(tb.stripe_customer, ''), coalesce(m.meter_id, ''),
	coalesce((SELECT max(a.finished_at) FROM outbox_attempts a WHERE a.item_id = o.id AND a.outcome = 'accepted'),
	         (SELECT max(r.created_at) FROM recovery_actions r WHERE r.item_id = o.id AND r.action = 'acknowledge' AND r.applied),
	         o.updated_at),
	coalesce(t.item_id, 0)
	FROM outbox_items o
	LEFT JOIN meter_mappings m ON m.destination_account = o.destination_account AND m.feature = o.feature
	LEFT JOIN tenant_billing tb ON tb.tenant = o.tenant AND tb.destination_account = o.destination_account
	LEFT JOIN usage_events c ON c.item_id = o.id AND c.kind = 'correction' AND o.quantity < 0
	LEFT JOIN usage_events t ON t.tenant = c.tenant AND t.event_id = c.corrects_event_id`

func scanLedger(rows pgx.Rows) ([]ledgerItem, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ledgerItem, error) {
		var it ledgerItem
		err := r.Scan(&it.ID, &it.Tenant, &it.Feature, &it.SubjectKind, &it.State, &it.Quantity, &it.OccurredAt, &it.Key,
			&it.LeaseToken, &it.Customer, &it.MeterID, &it.AcceptedAt, &it.TargetID)
		it.OccurredAt, it.AcceptedAt = it.OccurredAt.UTC(), it.AcceptedAt.UTC()
		return it, err
	})
}

// ledger is the items of one account over a time range, with the values
// they carry at Stripe.
type ledger struct {
	items []ledgerItem
	byID  map[int64]*ledgerItem // items plus the correction targets loaded outside the range
	// cancelledBy maps an item to the negative correction that cancels its
	// meter event.
	cancelledBy map[int64]int64
}

// loadLedger loads account's items whose meter event timestamp lies in
// [from, to), and the records negative corrections among them cancel.
func loadLedger(ctx context.Context, q Querier, account string, from, to time.Time) (*ledger, error) {
	rows, err := q.Query(ctx, `SELECT `+ledgerColumns+`
		WHERE o.destination_account = $1 AND o.occurred_at >= $2 AND o.occurred_at < $3 AND o.state = ANY($4)
		ORDER BY o.occurred_at, o.id`, account, from, to, loadedStates)
	if err != nil {
		return nil, fmt.Errorf("reconciler: load ledger: %w", err)
	}
	items, err := scanLedger(rows)
	if err != nil {
		return nil, fmt.Errorf("reconciler: load ledger: %w", err)
	}
	l := &ledger{items: items, byID: map[int64]*ledgerItem{}, cancelledBy: map[int64]int64{}}
	for i := range l.items {
		l.byID[l.items[i].ID] = &l.items[i]
	}
	// Follow correction chains outside the range (bounded: a chain is
	// linear, one cancel per record).
	for depth := 0; depth < 32; depth++ {
		var missing []int64
		for _, it := range l.byID {
			if it.TargetID != 0 && l.byID[it.TargetID] == nil {
				missing = append(missing, it.TargetID)
			}
		}
		if len(missing) == 0 {
			break
		}
		slices.Sort(missing)
		missing = slices.Compact(missing)
		rows, err := q.Query(ctx, `SELECT `+ledgerColumns+` WHERE o.id = ANY($1)`, missing)
		if err != nil {
			return nil, fmt.Errorf("reconciler: load ledger targets: %w", err)
		}
		extra, err := scanLedger(rows)
		if err != nil {
			return nil, fmt.Errorf("reconciler: load ledger targets: %w", err)
		}
		if len(extra) == 0 {
			break
		}
		for i := range extra {
			e := extra[i]
			l.byID[e.ID] = &e
		}
	}
	for _, it := range l.byID {
		if it.TargetID != 0 {
			l.cancelledBy[it.TargetID] = it.ID
		}
	}
	return l, nil
}

// committedState reports whether an item's meter event counts as sent: the
// provider took it.
func committedState(s string) bool { return s == "accepted" || s == "confirmed" }

// inFlight reports whether an item's outcome is still open.
func inFlight(s string) bool { return s == "pending" || s == "leased" }

// value is what item id carries at Stripe under its own identifier (usage
// correction rules, shared/usage/correction.go): an event's, a window's
// or a positive correction's quantity; for an accepted negative correction,
// the value of the record it cancels plus its (negative) quantity, at
// least 0. A record whose meter event an accepted negative correction
// cancelled carries 0. decided is false when the answer depends on an
// outcome still open (the correction or its target pending, leased or
// uncertain).
func (l *ledger) value(id int64) (v int64, decided bool) {
	return l.valueDepth(id, 0)
}

func (l *ledger) valueDepth(id int64, depth int) (int64, bool) {
	it := l.byID[id]
	if it == nil || depth > 32 {
		return 0, false
	}
	if c, ok := l.cancelledBy[id]; ok {
		switch cs := l.byID[c].State; {
		case committedState(cs):
			return 0, true
		case cs == "uncertain" || inFlight(cs):
			return 0, false
		}
	}
	if it.TargetID != 0 && it.Quantity < 0 {
		if !committedState(it.State) {
			return 0, it.State != "uncertain" && !inFlight(it.State)
		}
		// the target's value before this cancel
		t := l.byID[it.TargetID]
		if t == nil {
			return 0, false
		}
		tv, ok := l.rawValue(t, depth+1)
		if !ok {
			return 0, false
		}
		return max(0, tv+it.Quantity), true
	}
	return it.Quantity, true
}

// rawValue is the value a record carried before any cancel of it.
func (l *ledger) rawValue(it *ledgerItem, depth int) (int64, bool) {
	if it.TargetID != 0 && it.Quantity < 0 {
		t := l.byID[it.TargetID]
		if t == nil || depth > 32 {
			return 0, false
		}
		tv, ok := l.rawValue(t, depth+1)
		return max(0, tv+it.Quantity), ok
	}
	return it.Quantity, true
}
