package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/identity"
)

// TestSQLKeyMatchesGo: aurora_idempotency_key, called directly and as the
// staging trigger's expression, gives identity.Key's value for every part
// shape (the length prefixes are what keep "ab"+"c" apart from "a"+"bc").
func TestSQLKeyMatchesGo(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	cases := []struct {
		name                    string
		tenant, kind, ref, acct string
	}{
		{"ascii", "org_123", "event", "event:e1", "acct_1Test"},
		{"parts shifted left", "ab", "event", "c", "acct_1"},
		{"parts shifted right", "a", "event", "bc", "acct_1"},
		{"multi-byte UTF-8", "örg_ß", "usage_window", "usage:api_calls:2026-09-01T00:00:00Z:0:5", "acct_日本"},
		{"long reference", "org_1", "correction", strings.Repeat("x", 300), "acct_1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := identity.Key(c.tenant, identity.SubjectKind(c.kind), c.ref, c.acct)
			var got string
			if err := pool.QueryRow(ctx, `SELECT aurora_idempotency_key($1, $2, $3, $4)`, c.tenant, c.kind, c.ref, c.acct).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("SQL key %s, Go key %s", got, want)
			}
		})
	}
}

// TestSQLKeyIsInlined: migration 00310 declares aurora_idempotency_key
// STABLE so the planner substitutes its expression into callers instead of
// running the SQL-function executor once a row (an IMMUTABLE declaration
// over the STABLE convert_to blocked that).
func TestSQLKeyIsInlined(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	// The target list is on the plan's "Output:" line.
	rows, err := pool.Query(context.Background(),
		`EXPLAIN (VERBOSE, COSTS OFF) SELECT aurora_idempotency_key(tenant, subject_kind, subject_ref, destination_account) FROM outbox_items`)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		out = append(out, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(out, "\n")
	if strings.Contains(text, "aurora_idempotency_key") || !strings.Contains(text, "sha256") {
		t.Fatalf("aurora_idempotency_key is not inlined:\n%s", text)
	}
}
