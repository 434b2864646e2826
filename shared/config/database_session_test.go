package config

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestSessionBoundsDefaultsAndRanges(t *testing.T) {
	t.Parallel()
	var d Database
	if err := LoadFrom(&d, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	want := DatabaseSession{StatementTimeoutMS: StatementTimeoutMSDefault, LockTimeoutMS: LockTimeoutMSDefault,
		IdleInTransactionTimeoutMS: IdleInTransactionTimeoutMSDefault}
	if d.Session != want {
		t.Fatalf("defaults %+v, want %+v", d.Session, want)
	}
	tests := []struct {
		env              map[string]string
		wantVar, allowed string // "" when valid
	}{
		{map[string]string{"AURORA_DATABASE_STATEMENT_TIMEOUT_MS": "0", "AURORA_DATABASE_LOCK_TIMEOUT_MS": "0", "AURORA_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS": "0"}, "", ""},
		{map[string]string{"AURORA_DATABASE_STATEMENT_TIMEOUT_MS": "3600000", "AURORA_DATABASE_LOCK_TIMEOUT_MS": "100"}, "", ""},
		{map[string]string{"AURORA_DATABASE_STATEMENT_TIMEOUT_MS": "99"}, "AURORA_DATABASE_STATEMENT_TIMEOUT_MS", "0 (off) or 100..3600000 (milliseconds)"},
		{map[string]string{"AURORA_DATABASE_STATEMENT_TIMEOUT_MS": "3600001"}, "AURORA_DATABASE_STATEMENT_TIMEOUT_MS", "0 (off) or 100..3600000"},
		{map[string]string{"AURORA_DATABASE_LOCK_TIMEOUT_MS": "-1"}, "AURORA_DATABASE_LOCK_TIMEOUT_MS", "0 (off) or 100..3600000"},
		{map[string]string{"AURORA_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS": "50"}, "AURORA_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS", "0 (off) or 100..3600000"},
		{map[string]string{"AURORA_DATABASE_STATEMENT_TIMEOUT_MS": "1000", "AURORA_DATABASE_LOCK_TIMEOUT_MS": "2000"}, "AURORA_DATABASE_LOCK_TIMEOUT_MS", "at most AURORA_DATABASE_STATEMENT_TIMEOUT_MS (1000)"},
		{map[string]string{"AURORA_DATABASE_LOCK_TIMEOUT_MS": "soon"}, "AURORA_DATABASE_LOCK_TIMEOUT_MS", "0 (off) or 100..3600000"},
	}
	for _, tc := range tests {
		var d Database
		err := LoadFrom(&d, tc.env)
		if tc.wantVar == "" {
			if err != nil {
				t.Errorf("%v: %v", tc.env, err)
			}
			continue
		}
		var re *RangeError
		if !errors.As(err, &re) || !errors.Is(err, ErrInvalid) || re.Var != tc.wantVar || !strings.Contains(re.Allowed, tc.allowed) {
			t.Errorf("%v: %v, want a RangeError naming %s allowed %q", tc.env, err, tc.wantVar, tc.allowed)
		}
	}
}

func TestSessionURLAddsBoundsAndKeepsTheURLs(t *testing.T) {
	t.Parallel()
	d := Database{URL: "postgres://u:secret@db:5432/aurora?sslmode=disable&lock_timeout=250",
		Session: DatabaseSession{StatementTimeoutMS: 30000, LockTimeoutMS: 10000}}
	got := d.SessionURL()
	for _, want := range []string{"statement_timeout=30000", "lock_timeout=250", "sslmode=disable", "u:secret@db:5432/aurora"} {
		if !strings.Contains(got, want) {
			t.Errorf("%s lacks %s", got, want)
		}
	}
	if strings.Contains(got, "idle_in_transaction") {
		t.Errorf("%s sets a bound that is off", got)
	}
}

// A pool opened from SessionURL has the bounds on every connection, and
// Postgres cancels a statement that runs past the statement timeout.
func TestSessionBoundsApplyToPooledConnections(t *testing.T) {
	t.Parallel()
	d := Database{URL: dbtest.NewDatabase(t), Session: DatabaseSession{StatementTimeoutMS: 300, LockTimeoutMS: 200, IdleInTransactionTimeoutMS: 60000}}
	pool, err := pgxpool.New(context.Background(), d.SessionURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	for name, want := range map[string]string{"statement_timeout": "300ms", "lock_timeout": "200ms", "idle_in_transaction_session_timeout": "1min"} {
		var got string
		if err := pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&got); err != nil || got != want {
			t.Errorf("%s = %q (%v), want %q", name, got, err, want)
		}
	}
	start := time.Now()
	_, err = pool.Exec(ctx, "SELECT pg_sleep(5)")
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "57014" || time.Since(start) > 3*time.Second {
		t.Fatalf("a 5 s statement: %v after %s, want query_canceled (57014) after ~300 ms", err, time.Since(start))
	}
}
