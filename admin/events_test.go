package admin

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Event ids of seedEvents, by what they stand for.
const (
	evStuckInvoice = "00000000-0000-4000-8000-000000000001" // dispatched, processed by ledger and notify: stuck
	evHalfDone     = "00000000-0000-4000-8000-000000000002" // dispatched, processed by ledger only
	evStuckSub     = "00000000-0000-4000-8000-000000000003" // dispatched, processed by audit (its only consumer): stuck
	evNoConsumer   = "00000000-0000-4000-8000-000000000004" // dispatched, nobody registered for its type
	evAcked        = "00000000-0000-4000-8000-000000000005" // acknowledged already
	evPoison       = "00000000-0000-4000-8000-000000000006" // ledger processed, notify dead-lettered it
	evDispatchDead = "00000000-0000-4000-8000-000000000007" // dispatch dead letter
	evMissing      = "00000000-0000-4000-8000-0000000000ff"
)

// seedEvents writes the state an old deployment leaves behind (seed 004's
// stuck historical events among others) straight into the tables.
func seedEvents(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := dbtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	_, err = pool.Exec(context.Background(), `
INSERT INTO event_consumers (consumer, event_types) VALUES
  ('ledger', '{InvoicePaid.v1}'), ('notify', '{InvoicePaid.v1}'), ('audit', '{SubscriptionChanged.v1}');
INSERT INTO event_outbox (event_id, event_type, aggregate_id, payload, status, attempts, dispatched_at, acknowledged_at,
                          dead_lettered_at, last_reason, last_error, created_at) VALUES
  ('`+evStuckInvoice+`', 'InvoicePaid.v1', 'in_1', '{"secret":"cus_hidden"}', 'dispatched', 1, now() - interval '3 days', NULL, NULL, NULL, NULL, now() - interval '3 days'),
  ('`+evHalfDone+`', 'InvoicePaid.v1', 'in_2', '{}', 'dispatched', 1, now() - interval '2 days', NULL, NULL, NULL, NULL, now() - interval '2 days'),
  ('`+evStuckSub+`', 'SubscriptionChanged.v1', 'sub_1', '{}', 'dispatched', 1, now() - interval '2 days', NULL, NULL, NULL, NULL, now() - interval '2 days'),
  ('`+evNoConsumer+`', 'Unheard.v1', 'x_1', '{}', 'dispatched', 1, now() - interval '1 day', NULL, NULL, NULL, NULL, now() - interval '1 day'),
  ('`+evAcked+`', 'InvoicePaid.v1', 'in_3', '{}', 'acknowledged', 1, now() - interval '1 day', now(), NULL, NULL, NULL, now() - interval '1 day'),
  ('`+evPoison+`', 'InvoicePaid.v1', 'in_4', '{}', 'dead_letter', 1, now() - interval '1 day', NULL, now(), 'consumers_dead_lettered', NULL, now() - interval '1 day'),
  ('`+evDispatchDead+`', 'InvoicePaid.v1', 'in_5', '{}', 'dead_letter', 10, NULL, NULL, now(), 'dispatch_exhausted', 'nats: timeout', now() - interval '1 hour');
INSERT INTO event_inbox (consumer, event_id, status, attempts, processed_at, last_error, dead_lettered_at, dead_letter_reason) VALUES
  ('ledger', '`+evStuckInvoice+`', 'processed', 1, now(), NULL, NULL, NULL),
  ('notify', '`+evStuckInvoice+`', 'processed', 1, now(), NULL, NULL, NULL),
  ('ledger', '`+evHalfDone+`', 'processed', 1, now(), NULL, NULL, NULL),
  ('audit', '`+evStuckSub+`', 'processed', 1, now(), NULL, NULL, NULL),
  ('ledger', '`+evAcked+`', 'processed', 1, now(), NULL, NULL, NULL),
  ('notify', '`+evAcked+`', 'processed', 1, now(), NULL, NULL, NULL),
  ('ledger', '`+evPoison+`', 'processed', 1, now(), NULL, NULL, NULL),
  ('notify', '`+evPoison+`', 'failed', 5, NULL, 'ERROR: insert or update violates foreign key constraint (SQLSTATE 23503)', now(), 'handler_exhausted');`)
	if err != nil {
		t.Fatal(err)
	}
	return url, pool
}

// outboxSnapshot returns every event's status and acknowledged_at, and every
// inbox row's status, as one comparable string.
func outboxSnapshot(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	err := pool.QueryRow(context.Background(), `SELECT
	  (SELECT string_agg(event_id::text || '=' || status || '@' || coalesce(acknowledged_at::text, '-'), ' ' ORDER BY event_id) FROM event_outbox) || ' | ' ||
	  (SELECT string_agg(consumer || ':' || event_id::text || '=' || status || '/' || attempts, ' ' ORDER BY consumer, event_id) FROM event_inbox)`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func statusOf(t *testing.T, pool *pgxpool.Pool, id string) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `SELECT status FROM event_outbox WHERE event_id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// Must show: cleanup-stuck on a database seeded with dispatched-but-processed
// events prints them on a dry run and changes nothing; --yes acknowledges
// exactly those.
func TestEventsCleanupStuck(t *testing.T) {
	url, pool := seedEvents(t)
	env := map[string]string{"AURORA_DATABASE_URL": url, "AURORA_ACTOR": "op_alice"}
	before := outboxSnapshot(t, pool)

	code, out, errs := runCtl(t, env, "events", "cleanup-stuck")
	if code != 0 {
		t.Fatalf("dry run: %d %q %q", code, out, errs)
	}
	for _, id := range []string{evStuckInvoice, evStuckSub} {
		if !strings.Contains(out, id) {
			t.Errorf("dry run does not print stuck event %s:\n%s", id, out)
		}
	}
	for _, id := range []string{evHalfDone, evNoConsumer, evAcked, evPoison, evDispatchDead} {
		if strings.Contains(out, id) {
			t.Errorf("dry run prints %s, which is not stuck:\n%s", id, out)
		}
	}
	if !strings.Contains(out, "dry run: would acknowledge 2 events") || !strings.Contains(out, "ledger,notify") {
		t.Errorf("dry run output:\n%s", out)
	}
	if after := outboxSnapshot(t, pool); after != before {
		t.Fatalf("the dry run wrote:\nbefore %s\nafter  %s", before, after)
	}

	code, out, _ = runCtl(t, env, "events", "cleanup-stuck", "--json")
	var dry struct {
		DryRun       bool `json:"dry_run"`
		Acknowledged int  `json:"acknowledged"`
		Stuck        []struct {
			ID string `json:"event_id"`
		} `json:"stuck"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &dry) != nil || !dry.DryRun || dry.Acknowledged != 0 || len(dry.Stuck) != 2 ||
		dry.Stuck[0].ID != evStuckInvoice || dry.Stuck[1].ID != evStuckSub {
		t.Fatalf("dry run --json: %d %q", code, out)
	}
	if after := outboxSnapshot(t, pool); after != before {
		t.Fatal("the --json dry run wrote")
	}

	code, out, errs = runCtl(t, env, "events", "cleanup-stuck", "--yes")
	if code != 0 || !strings.Contains(out, "acknowledged 2 events") {
		t.Fatalf("--yes: %d %q %q", code, out, errs)
	}
	want := map[string]string{
		evStuckInvoice: "acknowledged", evStuckSub: "acknowledged", // exactly these two changed
		evHalfDone: "dispatched", evNoConsumer: "dispatched", evAcked: "acknowledged",
		evPoison: "dead_letter", evDispatchDead: "dead_letter",
	}
	for id, st := range want {
		if got := statusOf(t, pool, id); got != st {
			t.Errorf("%s is %s after --yes, want %s", id, got, st)
		}
	}
	var inboxBefore, inboxAfter string
	_, inboxBefore, _ = strings.Cut(before, " | ")
	_, inboxAfter, _ = strings.Cut(outboxSnapshot(t, pool), " | ")
	if inboxBefore != inboxAfter {
		t.Errorf("cleanup-stuck changed inbox rows:\n%s\n%s", inboxBefore, inboxAfter)
	}

	code, out, _ = runCtl(t, env, "events", "cleanup-stuck")
	if code != 0 || !strings.Contains(out, "no stuck events") {
		t.Fatalf("second dry run: %d %q", code, out)
	}
}

func TestEventsListInspect(t *testing.T) {
	url, _ := seedEvents(t)
	env := map[string]string{"AURORA_DATABASE_URL": url}

	code, out, _ := runCtl(t, env, "events", "list")
	if code != 0 || strings.Count(out, "\n") != 8 || strings.Contains(out, "cus_hidden") {
		t.Fatalf("list: %d %q", code, out)
	}
	code, out, _ = runCtl(t, env, "events", "list", "--status", "dispatched", "--type", "InvoicePaid.v1", "--json")
	var listed struct {
		Events []struct {
			ID     string `json:"event_id"`
			Status string `json:"status"`
		} `json:"events"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Events) != 2 ||
		listed.Events[0].ID != evStuckInvoice || listed.Events[1].ID != evHalfDone {
		t.Fatalf("list --status --type: %d %q", code, out)
	}
	code, out, _ = runCtl(t, env, "events", "list", "--dead-letter")
	if code != 0 || !strings.Contains(out, evPoison) || !strings.Contains(out, "notify") || !strings.Contains(out, "handler_exhausted") ||
		strings.Contains(out, evDispatchDead) {
		t.Fatalf("list --dead-letter: %d %q", code, out)
	}
	code, out, _ = runCtl(t, env, "events", "list", "--dead-letter", "--consumer", "ledger", "--json")
	if code != 0 || strings.TrimSpace(out) != "{\n  \"dead_letters\": []\n}" {
		t.Fatalf("list --dead-letter --consumer ledger: %d %q", code, out)
	}
	for _, args := range [][]string{
		{"events", "list", "--status", "done"},
		{"events", "list", "--type", "invoice.paid"},
		{"events", "list", "--limit", "0"},
		{"events", "list", "--consumer", "ledger"},
		{"events", "list", "--dead-letter", "--status", "failed"},
		{"events", "list", "--dead-letter", "--consumer", "Not A Name"},
		{"events", "inspect", "evt_1"},
	} {
		if code, _, _ := runCtl(t, env, args...); code != ExitInvalidInput {
			t.Errorf("%v: exit %d, want %d", args, code, ExitInvalidInput)
		}
	}

	code, out, _ = runCtl(t, env, "events", "inspect", evPoison)
	if code != 0 || textField(out, "status") != "dead_letter" || !strings.Contains(out, "inbox notify") ||
		!strings.Contains(out, "handler_exhausted") || textField(out, "waiting_for") != "notify" || strings.Contains(out, "payload:") {
		t.Fatalf("inspect: %d %q", code, out)
	}
	code, out, _ = runCtl(t, env, "events", "inspect", evStuckInvoice)
	if code != 0 || strings.Contains(out, "cus_hidden") {
		t.Fatalf("inspect prints the payload without --show-payload: %q", out)
	}
	code, out, _ = runCtl(t, env, "events", "inspect", evStuckInvoice, "--show-payload")
	if code != 0 || !strings.Contains(out, "cus_hidden") {
		t.Fatalf("inspect --show-payload: %d %q", code, out)
	}
	code, out, _ = runCtl(t, env, "events", "inspect", evStuckInvoice, "--json")
	var d struct {
		Status  string   `json:"status"`
		Waiting []string `json:"waiting_for"`
		Inbox   []any    `json:"inbox"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &d) != nil || d.Status != "dispatched" || len(d.Waiting) != 0 || len(d.Inbox) != 2 {
		t.Fatalf("inspect --json: %d %q", code, out)
	}
	if code, _, _ := runCtl(t, env, "events", "inspect", evMissing); code != ExitNotFound {
		t.Fatalf("inspect missing: %d", code)
	}
}

func TestEventsRequeue(t *testing.T) {
	url, pool := seedEvents(t)
	env := map[string]string{"AURORA_DATABASE_URL": url, "AURORA_ACTOR": "op_alice"}
	ctx := context.Background()
	before := outboxSnapshot(t, pool)

	// read-only without --yes
	code, out, errs := runCtl(t, env, "events", "requeue", evPoison, "--consumer", "notify", "--reason", "FK target backfilled, INC-9")
	if code != 0 || !strings.Contains(out, "dry run") || !strings.Contains(out, "inbox notify") || !strings.Contains(out, "outbox dead_letter → dispatched") {
		t.Fatalf("dry run: %d %q %q", code, out, errs)
	}
	if outboxSnapshot(t, pool) != before {
		t.Fatal("the dry run wrote")
	}
	var audits int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM event_requeues`).Scan(&audits)
	if audits != 0 {
		t.Fatal("the dry run was audited as a requeue")
	}

	if code, _, _ = runCtl(t, env, "events", "requeue", evPoison, "--consumer", "notify", "--yes"); code != ExitInvalidInput {
		t.Fatalf("requeue without reason: %d", code)
	}
	if code, _, _ = runCtl(t, env, "events", "requeue", evMissing, "--consumer", "notify", "--reason", "x", "--yes"); code != ExitNotFound {
		t.Fatalf("requeue missing: %d", code)
	}
	// the ledger processed it: not a dead letter, refused and audited as refused
	if code, _, _ = runCtl(t, env, "events", "requeue", evPoison, "--consumer", "ledger", "--reason", "try", "--yes"); code != ExitStateMismatch {
		t.Fatalf("requeue of a processed row: %d", code)
	}
	// a consumer's dead letter is not a dispatch dead letter
	if code, _, _ = runCtl(t, env, "events", "requeue", evPoison, "--reason", "try", "--yes"); code != ExitStateMismatch {
		t.Fatalf("requeue without --consumer of a consumer dead letter: %d", code)
	}

	code, out, errs = runCtl(t, env, "events", "requeue", evPoison, "--consumer", "notify", "--reason", "FK target backfilled, INC-9", "--yes")
	if code != 0 || !strings.Contains(out, "requeued "+evPoison+" for consumer notify by op_alice") {
		t.Fatalf("requeue: %d %q %q", code, out, errs)
	}
	var status string
	var attempts int
	var dead bool
	if err := pool.QueryRow(ctx, `SELECT status, attempts, dead_lettered_at IS NOT NULL FROM event_inbox WHERE consumer = 'notify' AND event_id = $1`, evPoison).
		Scan(&status, &attempts, &dead); err != nil || status != "failed" || attempts != 0 || dead {
		t.Fatalf("inbox after requeue: %s %d %v %v", status, attempts, dead, err)
	}
	if got := statusOf(t, pool, evPoison); got != "dispatched" {
		t.Fatalf("outbox after requeue: %s, want dispatched", got)
	}

	code, out, _ = runCtl(t, env, "events", "requeue", evDispatchDead, "--reason", "NATS back, INC-10", "--yes", "--json")
	var res struct {
		DryRun   bool   `json:"dry_run"`
		Operator string `json:"operator"`
		Requeue  struct {
			Applied bool `json:"applied"`
		} `json:"requeue"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.DryRun || !res.Requeue.Applied || res.Operator != "op_alice" {
		t.Fatalf("dispatch requeue --json: %d %q", code, out)
	}
	if got := statusOf(t, pool, evDispatchDead); got != "pending" {
		t.Fatalf("dispatch dead letter after requeue: %s, want pending", got)
	}

	rows, err := pool.Query(ctx, `SELECT event_id::text, coalesce(consumer, ''), operator, reason, outcome FROM event_requeues ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var id, consumer, op, reason, outcome string
		if err := rows.Scan(&id, &consumer, &op, &reason, &outcome); err != nil {
			t.Fatal(err)
		}
		got = append(got, strings.Join([]string{id[len(id)-2:], consumer, op, reason, outcome}, "|"))
	}
	want := []string{
		"06|ledger|op_alice|try|refused",
		"06||op_alice|try|refused",
		"06|notify|op_alice|FK target backfilled, INC-9|applied",
		"07||op_alice|NATS back, INC-10|applied",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("audit trail:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// textField returns the value of the first "key<spaces>value" line of a
// tabwriter rendering.
func textField(out, key string) string {
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
