package admin

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestInboxPlansCommands(t *testing.T) {
	url := dbtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	env := map[string]string{"AURORA_DATABASE_URL": url, "AURORA_ACTOR": "op_alice"}
	count := func(sql string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	code, out, _ := runCtl(t, env, "inbox", "plans", "list")
	if code != 0 || !strings.Contains(out, "no price is mapped") {
		t.Fatalf("empty list: %d %q", code, out)
	}
	for _, args := range [][]string{
		{"inbox", "plans", "set", "--price", "price_a", "--plan", "basic"},               // no reason
		{"inbox", "plans", "set", "--plan", "basic", "--reason", "r", "--yes"},           // no price
		{"inbox", "plans", "set", "--price", "price_a", "--reason", "r", "--yes"},        // no plan
		{"inbox", "plans", "set", "--price", " price_a", "--plan", "b", "--reason", "r"}, // padded
	} {
		if code, _, errs := runCtl(t, env, args...); code != ExitInvalidInput {
			t.Fatalf("%v: %d %q", args, code, errs)
		}
	}

	// read-only without --yes
	code, out, _ = runCtl(t, env, "inbox", "plans", "set", "--price", "price_a", "--plan", "basic", "--reason", "launch, INC-1")
	if code != 0 || !strings.Contains(out, "dry run: would map price_a: (not mapped) → basic") || !strings.Contains(out, "--yes") {
		t.Fatalf("dry run: %d %q", code, out)
	}
	if count(`SELECT count(*) FROM stripe_price_plans`)+count(`SELECT count(*) FROM stripe_price_plan_changes`) != 0 {
		t.Fatal("the dry run wrote")
	}
	code, out, _ = runCtl(t, env, "inbox", "plans", "set", "--price", "price_a", "--plan", "basic", "--reason", "launch, INC-1", "--yes")
	if code != 0 || !strings.Contains(out, "mapped price_a: (not mapped) → basic by op_alice") {
		t.Fatalf("set: %d %q", code, out)
	}
	code, out, _ = runCtl(t, env, "inbox", "plans", "set", "--price", "price_a", "--plan", "basic", "--reason", "again", "--yes")
	if code != 0 || !strings.Contains(out, "already maps to basic") {
		t.Fatalf("set again: %d %q", code, out)
	}
	code, out, _ = runCtl(t, env, "inbox", "plans", "set", "--price", "price_a", "--plan", "pro", "--reason", "renamed, INC-2", "--yes", "--json", "--actor", "op_bob")
	var set struct {
		DryRun bool `json:"dry_run"`
		Change struct {
			PriorPlan *string `json:"prior_plan"`
			Plan      string  `json:"plan"`
			Operator  string  `json:"operator"`
		} `json:"change"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &set) != nil || set.DryRun || set.Change.PriorPlan == nil || *set.Change.PriorPlan != "basic" ||
		set.Change.Plan != "pro" || set.Change.Operator != "op_bob" {
		t.Fatalf("set --json: %d %q", code, out)
	}
	if n := count(`SELECT count(*) FROM stripe_price_plan_changes WHERE price_id = 'price_a'`); n != 2 {
		t.Fatalf("%d audit rows, want 2", n)
	}
	if n := count(`SELECT count(*) FROM stripe_price_plan_changes
	                WHERE prior_plan = 'basic' AND plan = 'pro' AND operator = 'op_bob' AND reason = 'renamed, INC-2'`); n != 1 {
		t.Fatal("audit row of the remap missing")
	}

	code, out, _ = runCtl(t, env, "inbox", "plans", "list")
	if code != 0 || !strings.Contains(out, "price_a") || !strings.Contains(out, "pro") || !strings.Contains(out, "op_bob") {
		t.Fatalf("list: %d %q", code, out)
	}
	code, out, _ = runCtl(t, env, "inbox", "plans", "list", "--json")
	var list struct {
		Plans []struct {
			PriceID string `json:"price_id"`
			Plan    string `json:"plan"`
		} `json:"plans"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Plans) != 1 || list.Plans[0].Plan != "pro" {
		t.Fatalf("list --json: %d %q", code, out)
	}
}
