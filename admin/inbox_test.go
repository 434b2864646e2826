package admin

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/inbox"
	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// seedInbox stores one unlinked subscription event and one contradictory
// invoice (an immediate unrecognized_stripe_payload dead letter).
func seedInbox(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := dbtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()
	store := inbox.NewStore(pool, nil)
	created := time.Unix(1_750_000_000, 0)
	for _, ev := range []inbox.Received{
		{EventID: "evt_sub", Type: "customer.subscription.created", Created: &created, Customer: "cus_secret",
			Payload: []byte(`{"id":"evt_sub","object":"event","type":"customer.subscription.created","created":1750000000,"data":{"object":{"id":"sub_1","customer":"cus_secret","status":"active","items":{"data":[{"price":{"id":"price_a"}}]}}}}`)},
		{EventID: "evt_inv", Type: "invoice.paid", Created: &created, Customer: "cus_secret",
			Payload: []byte(`{"id":"evt_inv","object":"event","type":"invoice.paid","created":1750000000,"data":{"object":{"id":"in_1","customer":"cus_secret","subscription":"sub_1","parent":{"subscription_details":{"subscription":"sub_2"}}}}}`)},
	} {
		if _, err := store.Ingest(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := inbox.NewWorker(pool, inbox.WorkerConfig{}).RunPass(ctx); err != nil {
		t.Fatal(err)
	}
	return url, pool
}

func TestInboxCommands(t *testing.T) {
	url, pool := seedInbox(t)
	env := map[string]string{"AURORA_DATABASE_URL": url, "AURORA_ACTOR": "op_alice"}

	code, out, errs := runCtl(t, env, "inbox", "inventory", "--json")
	var inv map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &inv) != nil || inv["pending"] != 1.0 || inv["dead_letter"] != 1.0 || inv["highest_attempt_count"] != 1.0 {
		t.Fatalf("inventory: %d %q %q", code, out, errs)
	}
	code, out, _ = runCtl(t, env, "inbox", "inventory")
	if code != 0 || !strings.Contains(out, "pending 1\ndead_letter 1\nhighest_attempt_count 1") {
		t.Fatalf("inventory text: %q", out)
	}

	code, out, _ = runCtl(t, env, "inbox", "list", "--dead-letter")
	if code != 0 || !strings.Contains(out, "evt_inv") || !strings.Contains(out, "unrecognized_stripe_payload") || strings.Contains(out, "evt_sub") {
		t.Fatalf("list: %d %q", code, out)
	}
	if code, _, _ = runCtl(t, env, "inbox", "list"); code != ExitInvalidInput {
		t.Fatalf("list without --dead-letter: %d", code)
	}

	code, out, _ = runCtl(t, env, "inbox", "inspect", "evt_inv")
	if code != 0 || !strings.Contains(out, "dead_letter") || strings.Contains(out, "cus_secret") || strings.Contains(out, "payload:") {
		t.Fatalf("inspect shows payload or customer: %q", out)
	}
	code, out, _ = runCtl(t, env, "inbox", "inspect", "evt_inv", "--show-payload")
	if code != 0 || !strings.Contains(out, "cus_secret") {
		t.Fatalf("inspect --show-payload: %q", out)
	}
	if code, _, _ = runCtl(t, env, "inbox", "inspect", "evt_nope"); code != ExitNotFound {
		t.Fatalf("inspect missing: %d", code)
	}

	// requeue: read-only without --yes
	code, out, _ = runCtl(t, env, "inbox", "requeue", "evt_inv", "--reason", "verified at Stripe, INC-7")
	if code != 0 || !strings.Contains(out, "dry run") {
		t.Fatalf("dry run: %d %q", code, out)
	}
	var dead int
	_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM billing_events WHERE dead_letter_at IS NOT NULL`).Scan(&dead)
	if dead != 1 {
		t.Fatal("the dry run wrote")
	}
	if code, _, _ = runCtl(t, env, "inbox", "requeue", "evt_inv", "--yes"); code != ExitInvalidInput {
		t.Fatalf("requeue without reason: %d", code)
	}
	if code, _, _ = runCtl(t, env, "inbox", "requeue", "evt_nope", "--reason", "x", "--yes"); code != ExitNotFound {
		t.Fatalf("requeue missing: %d", code)
	}
	if code, _, _ = runCtl(t, env, "inbox", "requeue", "evt_sub", "--reason", "x", "--yes"); code != ExitStateMismatch {
		t.Fatalf("requeue pending: %d", code)
	}
	code, out, errs = runCtl(t, env, "inbox", "requeue", "evt_inv", "--reason", "verified at Stripe, INC-7", "--yes")
	if code != 0 || !strings.Contains(out, "requeued evt_inv by op_alice") {
		t.Fatalf("requeue: %d %q %q", code, out, errs)
	}
	var operator, reason string
	var prior int
	if err := pool.QueryRow(context.Background(), `SELECT operator, reason, prior_attempts FROM billing_event_requeues WHERE event_id = 'evt_inv'`).
		Scan(&operator, &reason, &prior); err != nil || operator != "op_alice" || reason != "verified at Stripe, INC-7" || prior != 1 {
		t.Fatalf("audit: %s %s %d %v", operator, reason, prior, err)
	}
	code, out, _ = runCtl(t, env, "inbox", "inspect", "evt_inv", "--json")
	var info map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &info) != nil || info["state"] != "pending" || info["attempts"] != 0.0 {
		t.Fatalf("after requeue: %q", out)
	}
}
