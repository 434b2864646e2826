package admin

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/aurora-billing/aurora/shared/usage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// -update rewrites the golden files under testdata/recovery:
//
//	go test ./admin -run Recovery -update
//
// The flag is registered only if no other test file of the package did.
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite golden files")
	}
}

func recoveryUpdateGoldens() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

var recSept = time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)

// recoveryDB is a fresh database with four items, ids fixed by insertion
// order:
//
//	1  usage window org_123 api_calls 0..5, uncertain, lease_token 3, 3 attempts
//	2  event req-1, uncertain, lease_token 2
//	3  event req-2 built unmapped (version 0), quarantined feature_unmapped; the feature is mapped since
//	4  usage window org_456 api_calls 0..9, quarantined customer_missing, mapping version 1 (current)
type recoveryDB struct {
	t    *testing.T
	ctx  context.Context
	pool *pgxpool.Pool
	env  map[string]string
}

func newRecoveryDB(t *testing.T) *recoveryDB {
	t.Helper()
	dbURL := dbtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	d := &recoveryDB{t: t, ctx: context.Background(), pool: pool,
		env: map[string]string{"AURORA_DATABASE_URL": dbURL, "AURORA_ACTOR": "liam"}}
	d.exec(`INSERT INTO stripe_accounts (account_id, mode, confirmed) VALUES ('acct_1Test', 'test', true)`)
	rec := usage.Recorder{DestinationAccount: "acct_1Test", Mode: identity.ModeTest, Period: usage.PeriodDay}

	w1 := d.stageWindow("org_123", 0, 5, 0)
	d.uncertain(w1, 3)
	var e1, e2 outbox.Row
	err = pgx.BeginFunc(d.ctx, pool, func(tx pgx.Tx) error {
		var err error
		ev := usage.Event{Tenant: "org_123", EventID: "req-1", Feature: "api_calls", Quantity: 7, OccurredAt: recSept.Add(10 * time.Hour)}
		if e1, _, err = rec.Record(d.ctx, tx, ev); err != nil {
			return err
		}
		ev.EventID, ev.Quantity = "req-2", 2
		e2, _, err = rec.Record(d.ctx, tx, ev)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	d.uncertain(e1.ID, 2)
	d.quarantine(e2.ID, outbox.ReasonFeatureUnmapped)
	d.exec(`INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name, mapping_version)
		VALUES ('acct_1Test', 'api_calls', 'mtr_1', 'api_calls', 1)`)
	w2 := d.stageWindow("org_456", 0, 9, 0)
	d.quarantine(w2, outbox.ReasonCustomerMissing)
	if w1 != 1 || e1.ID != 2 || e2.ID != 3 || w2 != 4 {
		t.Fatalf("fixture ids %d %d %d %d", w1, e1.ID, e2.ID, w2)
	}
	return d
}

func (d *recoveryDB) exec(sql string, args ...any) {
	d.t.Helper()
	if _, err := d.pool.Exec(d.ctx, sql, args...); err != nil {
		d.t.Fatalf("%s: %v", sql, err)
	}
}

func (d *recoveryDB) stageWindow(tenant string, from, to int64, generation int) int64 {
	d.t.Helper()
	var id int64
	err := pgx.BeginFunc(d.ctx, d.pool, func(tx pgx.Tx) error {
		row, err := outbox.Stage(d.ctx, tx, outbox.Item{
			Identity: identity.Identity{Tenant: tenant, SubjectKind: identity.SubjectUsageWindow,
				SubjectRef: usage.WindowSubjectRef("api_calls", recSept, from, to, generation), Exporter: outbox.DefaultExporter,
				DestinationAccount: "acct_1Test", Mode: identity.ModeTest, MappingVersion: 1},
			Feature: "api_calls", Quantity: to - from, OccurredAt: recSept.Add(23 * time.Hour), PeriodStart: recSept,
		})
		if err != nil {
			return err
		}
		id = row.ID
		_, err = tx.Exec(d.ctx, `INSERT INTO usage_windows (tenant, feature, period_start, acknowledged_to, generation, staged_item_id)
			VALUES ($1, 'api_calls', $2, $3, $4, $5)`, tenant, recSept, from, generation, row.ID)
		return err
	})
	if err != nil {
		d.t.Fatal(err)
	}
	return id
}

func (d *recoveryDB) uncertain(id, leaseToken int64) {
	d.t.Helper()
	d.exec(`UPDATE outbox_items SET state = 'uncertain', lease_token = $2::bigint, attempts = $2::int,
		first_attempt_at = '2026-09-14T09:00:00Z', last_error = 'timeout awaiting response', published_dispatch = dispatch WHERE id = $1`, id, leaseToken)
	for a := int64(1); a <= leaseToken; a++ {
		outcome := "retry"
		if a == leaseToken {
			outcome = "uncertain"
		}
		d.exec(`INSERT INTO outbox_attempts (item_id, attempt, lease_token, started_at, finished_at, outcome, http_status, stripe_request_id, error_code)
			VALUES ($1, $2::int, $3::bigint, '2026-09-14T09:00:00Z'::timestamptz + make_interval(hours => $2::int),
			        '2026-09-14T09:00:30Z'::timestamptz + make_interval(hours => $2::int), $4, NULL, NULL, 'timeout')`, id, a, a, outcome)
	}
}

func (d *recoveryDB) quarantine(id int64, reason outbox.Reason) {
	d.t.Helper()
	d.exec(`UPDATE outbox_items SET state = 'quarantined', quarantine_reason = $2, lease_token = 1, attempts = 1,
		first_attempt_at = '2026-09-14T09:00:00Z', published_dispatch = dispatch WHERE id = $1`, id, string(reason))
}

func (d *recoveryDB) count(sql string) int {
	d.t.Helper()
	var n int
	if err := d.pool.QueryRow(d.ctx, sql).Scan(&n); err != nil {
		d.t.Fatal(err)
	}
	return n
}

// normalise masks the timestamps the database chose (now() at insert or
// update, all after the September 2026 fixtures), so goldens are stable:
// "<now>" inside JSON strings, the same-width YYYY-MM-DDThh:mm:ssZ in text
// tables. Fixture times stay.
func (d *recoveryDB) normalise(s string) string {
	cutoff := recSept.AddDate(0, 1, 0)
	return recoveryStamp.ReplaceAllStringFunc(s, func(m string) string {
		quoted := strings.HasPrefix(m, `"`)
		t, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(m, `"`))
		if err != nil || t.Before(cutoff) {
			return m
		}
		if quoted {
			return `"<now>`
		}
		return "YYYY-MM-DDThh:mm:ssZ"
	})
}

var recoveryStamp = regexp.MustCompile(`"?\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z`)

func recoveryGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "recovery", name+".golden")
	if recoveryUpdateGoldens() {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./admin -run Recovery -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (rerun with -update if the change is intended)\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestRecoveryGoldens(t *testing.T) {
	d := newRecoveryDB(t)
	tests := []struct {
		name string
		args []string
	}{
		{"list", []string{"recovery", "list", "--state", "uncertain", "--older-than", "0s"}},
		{"list_json", []string{"recovery", "list", "--state", "uncertain", "--json"}},
		{"list_quarantined", []string{"recovery", "list", "--state", "quarantined", "--limit", "10"}},
		{"inspect", []string{"recovery", "inspect", "1"}},
		{"inspect_json", []string{"recovery", "inspect", "1", "--json"}},
		{"acknowledge_dry_run", []string{"recovery", "acknowledge", "1", "--provider-ref", "req_TEST",
			"--reason", "verified in the Stripe dashboard", "--evidence", "request log req_TEST at 2026-09-15T09:12Z shows a 200 for this identifier"}},
		{"acknowledge_dry_run_json", []string{"recovery", "acknowledge", "1", "--provider-ref", "req_TEST",
			"--reason", "verified in the Stripe dashboard", "--evidence", "request log req_TEST shows a 200", "--json"}},
		{"abandon_window_dry_run", []string{"recovery", "abandon", "1", "--reason", "no meter event for this identifier",
			"--evidence", "searched 2026-09-15 09:00Z to 10:00Z, 0 results"}},
		{"abandon_event_dry_run", []string{"recovery", "abandon", "2", "--reason", "no meter event for this identifier",
			"--evidence", "searched 2026-09-15 09:00Z to 10:00Z, 0 results", "--actor", "ana"}},
		{"abandon_event_dry_run_json", []string{"recovery", "abandon", "2", "--reason", "no meter event for this identifier",
			"--evidence", "searched, 0 results", "--json"}},
		{"requeue_dry_run", []string{"recovery", "requeue", "4", "--reason", "linked the tenant's Stripe customer"}},
	}
	for _, tt := range tests {
		code, out, errOut := runCtl(t, d.env, tt.args...)
		if code != ExitOK || errOut != "" {
			t.Fatalf("%s: code %d stderr %q", tt.name, code, errOut)
		}
		recoveryGolden(t, tt.name, d.normalise(out))
	}
	// the dry runs wrote nothing
	if n := d.count(`SELECT count(*) FROM recovery_actions`); n != 0 {
		t.Fatalf("dry runs recorded %d actions", n)
	}
	if n := d.count(`SELECT count(*) FROM outbox_items WHERE state IN ('uncertain', 'quarantined')`); n != 4 {
		t.Fatalf("dry runs moved items: %d left", n)
	}

	// Applied, then the golden files of the applied JSON and of the actions.
	code, out, errOut := runCtl(t, d.env, "recovery", "abandon", "2", "--reason", "no meter event for this identifier",
		"--evidence", "searched 2026-09-15 09:00Z to 10:00Z, 0 results", "--yes", "--json")
	if code != ExitOK {
		t.Fatalf("abandon: %d %q", code, errOut)
	}
	recoveryGolden(t, "abandon_event_applied_json", d.normalise(out))
	code, out, _ = runCtl(t, d.env, "recovery", "requeue", "4", "--reason", "linked the tenant's Stripe customer", "--yes")
	if code != ExitOK {
		t.Fatalf("requeue: %d", code)
	}
	recoveryGolden(t, "requeue_applied", d.normalise(out))
	code, out, _ = runCtl(t, d.env, "recovery", "actions", "2", "--json")
	if code != ExitOK {
		t.Fatalf("actions: %d", code)
	}
	recoveryGolden(t, "actions_json", d.normalise(out))
}

// A stale screen: the operator pinned what they saw (lease token 2); the
// item was reclaimed since (3). Refused with exit 4 and a one-line message,
// recorded as a refused action, the row untouched.
func TestRecoveryStaleScreenRefusedAndRecorded(t *testing.T) {
	d := newRecoveryDB(t)
	args := []string{"recovery", "acknowledge", "1", "--expect-state", "uncertain", "--expect-lease-token", "2",
		"--expect-subject-ref", "usage:api_calls:2026-09-01T00:00:00Z:0:5", "--provider-ref", "req_TEST",
		"--reason", "verified in the Stripe dashboard", "--evidence", "req_TEST shows a 200"}
	// the dry run already says so, and records nothing
	code, _, errOut := runCtl(t, d.env, args...)
	if code != ExitStateMismatch || !strings.Contains(errOut, "lease_token: expected 2, now 3") || strings.Contains(errOut, "recorded") {
		t.Fatalf("dry run: code %d stderr %q", code, errOut)
	}
	if n := d.count(`SELECT count(*) FROM recovery_actions`); n != 0 {
		t.Fatalf("dry run recorded %d", n)
	}
	code, out, errOut := runCtl(t, d.env, append(args, "--yes", "--json")...)
	if code != ExitStateMismatch {
		t.Fatalf("code %d stderr %q", code, errOut)
	}
	if errOut != "auroractl: expected_state_mismatch: item 1 moved since your screen (lease_token: expected 2, now 3); "+
		"re-read it with `auroractl recovery inspect 1` and decide again (refusal recorded as action #1)\n" {
		t.Fatalf("stderr %q", errOut)
	}
	recoveryGolden(t, "acknowledge_stale_refused_json", d.normalise(out))
	if n := d.count(`SELECT count(*) FROM recovery_actions WHERE item_id = 1 AND NOT applied AND refusal = 'expected_state_mismatch' AND actor = 'liam'`); n != 1 {
		t.Fatalf("refusal rows %d", n)
	}
	if n := d.count(`SELECT count(*) FROM outbox_items WHERE id = 1 AND state = 'uncertain' AND provider_ref IS NULL`); n != 1 {
		t.Fatal("row moved")
	}
	// The same call with the screen pinned right applies.
	args[6] = "3"
	if code, _, errOut := runCtl(t, d.env, append(args, "--yes")...); code != ExitOK {
		t.Fatalf("pinned right: %d %q", code, errOut)
	}
	if n := d.count(`SELECT count(*) FROM outbox_items WHERE id = 1 AND state = 'accepted' AND provider_ref = 'req_TEST'`); n != 1 {
		t.Fatal("not accepted")
	}
}

func TestRecoveryExitCodes(t *testing.T) {
	d := newRecoveryDB(t)
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		code     int
		stderr   string // substring
		recorded int    // recovery_actions rows after
	}{
		{"not found", []string{"recovery", "inspect", "99"}, nil, ExitNotFound, "item 99 not found; find ids with `auroractl recovery list`", 0},
		{"not found write", []string{"recovery", "abandon", "99", "--reason", "r", "--evidence", "e", "--yes"}, nil, ExitNotFound, "item 99 not found", 0},
		{"bad id", []string{"recovery", "inspect", "x"}, nil, ExitInvalidInput, "item id \"x\" is not a positive integer", 0},
		{"no id", []string{"recovery", "inspect"}, nil, ExitInvalidInput, "accepts 1 arg(s)", 0},
		{"bad state", []string{"recovery", "list", "--state", "pending"}, nil, ExitInvalidInput, "invalid_query", 0},
		{"bad duration", []string{"recovery", "list", "--older-than", "1d"}, nil, ExitInvalidInput, "invalid argument", 0},
		{"bad limit", []string{"recovery", "list", "--limit", "0"}, nil, ExitInvalidInput, "limit 0 outside 1..1000", 0},
		{"dry run blank reason", []string{"recovery", "abandon", "1", "--evidence", "e"}, nil, ExitInvalidInput, "invalid_reason: --reason is blank; say why", 0},
		{"blank reason", []string{"recovery", "abandon", "1", "--reason", " ", "--evidence", "e", "--yes"}, nil, ExitInvalidInput,
			"invalid_reason: --reason is blank; say why you are doing this (refusal recorded as action #1)", 1},
		{"blank evidence", []string{"recovery", "acknowledge", "1", "--reason", "r", "--yes"}, nil, ExitInvalidInput,
			"invalid_evidence: --evidence is blank", 2},
		{"wrong state for action", []string{"recovery", "requeue", "1", "--reason", "r", "--yes"}, nil, ExitInvalidInput,
			"invalid_expected: --expect-state this action applies only to quarantined items, not uncertain", 3},
		{"pinned state mismatch", []string{"recovery", "requeue", "1", "--reason", "r", "--expect-state", "quarantined", "--yes"}, nil, ExitStateMismatch,
			"state: expected quarantined, now uncertain", 4},
		{"mapping changed dry run", []string{"recovery", "requeue", "3", "--reason", "mapped api_calls"}, nil, ExitRefused,
			"mapping_changed: item 3 was built for mapping version 0 and the feature's mapping is now 1", 4},
		{"mapping changed", []string{"recovery", "requeue", "3", "--reason", "mapped api_calls", "--yes"}, nil, ExitRefused,
			"(refusal recorded as action #5)", 5},
		{"no database", []string{"recovery", "list"}, map[string]string{"AURORA_DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"}, ExitFailure,
			"cannot reach the database at postgres://nobody@127.0.0.1:1/none", 5},
	}
	for _, tt := range tests {
		env := d.env
		if tt.env != nil {
			env = tt.env
		}
		code, _, errOut := runCtl(t, env, tt.args...)
		if code != tt.code || !strings.Contains(errOut, tt.stderr) || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "auroractl: ") {
			t.Errorf("%s: code %d stderr %q, want %d containing %q", tt.name, code, errOut, tt.code, tt.stderr)
		}
		if n := d.count(`SELECT count(*) FROM recovery_actions`); n != tt.recorded {
			t.Errorf("%s: %d actions recorded, want %d", tt.name, n, tt.recorded)
		}
	}
	// The refusals are visible to the next operator.
	code, out, _ := runCtl(t, d.env, "recovery", "actions", "1")
	if code != ExitOK || strings.Count(out, "refused: ") != 4 || !strings.Contains(out, "refused: expected_state_mismatch") {
		t.Fatalf("actions: %d %q", code, out)
	}
}

func TestRecoveryActorDefaults(t *testing.T) {
	d := newRecoveryDB(t)
	env := map[string]string{"AURORA_DATABASE_URL": d.env["AURORA_DATABASE_URL"], "AURORA_ACTOR": ""}
	code, _, errOut := runCtl(t, env, "recovery", "requeue", "4", "--reason", "fixed", "--yes")
	if code != ExitOK {
		t.Fatalf("%d %q", code, errOut)
	}
	var actor string
	if err := d.pool.QueryRow(d.ctx, `SELECT actor FROM recovery_actions`).Scan(&actor); err != nil {
		t.Fatal(err)
	}
	if actor != Actor("") || actor == "" {
		t.Fatalf("actor %q, want the OS user %q", actor, Actor(""))
	}
	env["AURORA_ACTOR"] = "from-env"
	if code, _, _ := runCtl(t, env, "recovery", "actions", "4"); code != ExitOK {
		t.Fatal(code)
	}
	code, out, _ := runCtl(t, env, "recovery", "abandon", "1", "--reason", "r", "--evidence", "e")
	if code != ExitOK || !strings.Contains(out, "actor") || !strings.Contains(out, "from-env") {
		t.Fatalf("dry run actor: %q", out)
	}
	code, out, _ = runCtl(t, env, "recovery", "abandon", "1", "--reason", "r", "--evidence", "e", "--actor", "flagged")
	if code != ExitOK || !strings.Contains(out, "flagged") || !strings.Contains(out, "--actor flagged") {
		t.Fatalf("dry run --actor: %q", out)
	}
}
