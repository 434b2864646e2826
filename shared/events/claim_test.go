package events

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
)

// IsDuplicateClaim is decided by SQLSTATE and constraint name, on errors
// Postgres really returns: only the inbox key's unique violation is a
// duplicate.
func TestIsDuplicateClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	id := e.publish("InvoicePaid.v1", 1)[0]
	if _, err := e.pool.Exec(ctx, sqlRegisterConsumer, "ledger", []string{"InvoicePaid.v1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, sqlClaimNew, "ledger", id, nil); err != nil {
		t.Fatal(err)
	}
	pgErr := func(sql string, args ...any) error {
		_, err := e.pool.Exec(ctx, sql, args...)
		if err == nil {
			t.Fatalf("%s: no error", sql)
		}
		return err
	}
	tests := []struct {
		name string
		err  error
		dup  bool
	}{
		{"inbox key taken (23505 on event_inbox_pkey)", pgErr(sqlClaimNew, "ledger", id, nil), true},
		{"wrapped", fmt.Errorf("claim: %w", pgErr(sqlClaimNew, "ledger", id, nil)), true},
		{"foreign key: unknown event (23503)", pgErr(sqlClaimNew, "ledger", NewID(), nil), false},
		{"foreign key: unregistered consumer (23503)", pgErr(sqlClaimNew, "nobody", id, nil), false},
		{"check violation (23514)", pgErr(`INSERT INTO event_inbox (consumer, event_id, status) VALUES ('ledger', $1, 'bogus')`, e.publish("InvoicePaid.v1", 1)[0]), false},
		{"unique violation on another constraint", pgErr(`INSERT INTO event_outbox (event_id, event_type, aggregate_id, payload) VALUES ($1, 'InvoicePaid.v1', 'a', '{}')`, id), false},
		{"lost connection", errors.New("read tcp: connection reset by peer"), false},
		{"no rows", pgx.ErrNoRows, false},
		{"context canceled", context.Canceled, false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		if got := IsDuplicateClaim(tt.err); got != tt.dup {
			t.Errorf("%s: IsDuplicateClaim(%v) = %v, want %v", tt.name, tt.err, got, tt.dup)
		}
	}
}
