package admin

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/jackc/pgx/v5"
)

func TestCutoverCommands(t *testing.T) {
	dbURL := dbtest.NewDatabase(t)
	env := map[string]string{"AURORA_DATABASE_URL": dbURL, "AURORA_ACTOR": "liam", "AURORA_USAGE_PERIOD": "day"}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	count := func(sql string) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Read-only without --yes.
	code, out, stderr := runCtl(t, env, "cutover", "schedule", "--feature", "api_calls", "--at", "2026-10-01T00:00:00Z")
	if code != ExitOK || !strings.Contains(out, "dry run: nothing written") || !strings.Contains(out, "AURORA_FEATURE_SOURCES=api_calls:events") {
		t.Fatalf("dry run: %d %q %q", code, out, stderr)
	}
	if n := count(`SELECT count(*) FROM usage_cutovers`); n != 0 {
		t.Fatalf("dry run wrote %d rows", n)
	}
	code, out, stderr = runCtl(t, env, "cutover", "schedule", "--feature", "api_calls", "--at", "2026-10-01T00:00:00Z", "--yes", "--json")
	var sched struct {
		Scheduled bool `json:"scheduled"`
		Cutover   struct {
			At      string `json:"at"`
			Version int    `json:"version"`
		} `json:"cutover"`
	}
	if code != ExitOK || json.Unmarshal([]byte(out), &sched) != nil || !sched.Scheduled || sched.Cutover.At != "2026-10-01T00:00:00Z" || sched.Cutover.Version != 1 {
		t.Fatalf("schedule: %d %q %q", code, out, stderr)
	}
	// A second schedule, for all tenants or one tenant: already_scheduled, exit 5.
	for _, args := range [][]string{
		{"cutover", "schedule", "--feature", "api_calls", "--at", "2026-10-02T00:00:00Z", "--yes"},
		{"cutover", "schedule", "--feature", "api_calls", "--at", "2026-10-02T00:00:00Z", "--tenant", "org_123"},
	} {
		code, _, stderr = runCtl(t, env, args...)
		if code != ExitRefused || !strings.HasPrefix(stderr, "auroractl: already_scheduled: ") || !strings.Contains(stderr, "--expect-version 1") {
			t.Fatalf("%v: %d %q", args, code, stderr)
		}
	}
	// Invalid input: exit 2.
	for _, args := range [][]string{
		{"cutover", "schedule", "--feature", "egress", "--at", "tomorrow"},
		{"cutover", "schedule", "--feature", "egress", "--at", "2026-10-02T05:00:00Z"},
		{"cutover", "schedule", "--at", "2026-10-02T00:00:00Z"},
	} {
		if code, _, stderr := runCtl(t, env, args...); code != ExitInvalidInput {
			t.Fatalf("%v: %d %q", args, code, stderr)
		}
	}

	code, out, stderr = runCtl(t, env, "cutover", "status", "--feature", "api_calls", "--json")
	var st map[string]any
	if code != ExitOK || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status: %d %q %q", code, out, stderr)
	}
	for _, k := range []string{"watermark", "buffered_periods_open", "event_items", "drained"} {
		if _, ok := st[k]; !ok {
			t.Fatalf("status JSON lacks %s: %s", k, out)
		}
	}
	if code, _, _ := runCtl(t, env, "cutover", "status", "--feature", "egress"); code != ExitNotFound {
		t.Fatalf("status of an unscheduled feature: %d", code)
	}

	resched := []string{"cutover", "reschedule", "--feature", "api_calls", "--at", "2026-10-02T00:00:00Z",
		"--expect-watermark", "2026-10-01T00:00:00Z", "--expect-version", "1", "--reason", "finance moved it", "--evidence", "ticket FIN-42"}
	code, out, _ = runCtl(t, env, resched...)
	if code != ExitOK || !strings.Contains(out, "dry run") || !strings.Contains(out, "2026-10-01T00:00:00Z -> 2026-10-02T00:00:00Z") ||
		count(`SELECT count(*) FROM recovery_actions`) != 0 {
		t.Fatalf("reschedule dry run: %d %q", code, out)
	}
	code, out, stderr = runCtl(t, env, append(resched, "--yes")...)
	if code != ExitOK || !strings.Contains(out, "rescheduled") {
		t.Fatalf("reschedule: %d %q %q", code, out, stderr)
	}
	// The same screen again is stale: exit 4, recorded.
	code, _, stderr = runCtl(t, env, append(resched, "--yes")...)
	if code != ExitStateMismatch || !strings.Contains(stderr, "expected_state_mismatch (recorded)") || !strings.Contains(stderr, "version 2") {
		t.Fatalf("stale reschedule: %d %q", code, stderr)
	}
	if n := count(`SELECT count(*) FROM recovery_actions WHERE action = 'reschedule_cutover' AND actor = 'liam'`); n != 2 {
		t.Fatalf("%d actions, want 2", n)
	}
	if n := count(`SELECT count(*) FROM recovery_actions WHERE NOT applied AND refusal = 'expected_state_mismatch'`); n != 1 {
		t.Fatalf("%d refused actions, want 1", n)
	}

	code, out, _ = runCtl(t, env, "cutover", "actions", "--feature", "api_calls")
	if code != ExitOK || !strings.Contains(out, "applied") || !strings.Contains(out, "refused: expected_state_mismatch") {
		t.Fatalf("actions: %d %q", code, out)
	}
}
