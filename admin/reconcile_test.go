package admin

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aurora-billing/aurora/reconcilertest"
)

// auroractl reconcile on a real database and the emulator: local, a dry
// run that writes nothing, a run that confirms and finds an injected double
// application, list, resolve (blank refused invalid_resolution, a dry run,
// then applied), inspect, and recovery inspect showing the window.
func TestReconcileCommands(t *testing.T) {
	start := time.Now().UTC().Add(-3 * time.Hour).Truncate(time.Hour)
	h := reconcilertest.New(t, reconcilertest.Options{Start: start})
	h.Customer("t1", "cus_1", true)
	h.Clock.Set(start.Add(10 * time.Minute))
	good := h.Send("t1", "api_calls", reconcilertest.Ref(1), 2, start.Add(5*time.Minute))
	h.Clock.Set(start.Add(70 * time.Minute))
	twice := h.Send("t1", "api_calls", reconcilertest.Ref(2), 3, start.Add(65*time.Minute))
	var key string
	if err := h.Pool.QueryRow(h.Ctx, `SELECT idempotency_key FROM outbox_items WHERE id = $1`, twice).Scan(&key); err != nil {
		t.Fatal(err)
	}
	if err := h.Emu.ApplyTwice(key); err != nil {
		t.Fatal(err)
	}
	h.Clock.Set(time.Now().UTC())
	env := map[string]string{"AURORA_DATABASE_URL": h.DatabaseURL, "AURORA_ACTOR": "liam",
		"AURORA_STRIPE_API_KEY": reconcilertest.APIKey, "AURORA_STRIPE_API_BASE": h.APIBase,
		"AURORA_STRIPE_ACCOUNT": reconcilertest.Account, "AURORA_RECONCILER_SETTLE_LAG_SECONDS": "60"}

	code, out, errOut := runCtl(t, env, "reconcile", "local", "--json")
	if code != ExitOK || !strings.Contains(out, `"items_open": 0`) || !strings.Contains(out, `"local_drift": []`) {
		t.Fatalf("local: %d %q %q", code, out, errOut)
	}
	code, out, errOut = runCtl(t, env, "reconcile", "run")
	if code != ExitOK || !strings.Contains(out, "dry run: nothing recorded") || !strings.Contains(out, "summary_excess") {
		t.Fatalf("dry run: %d %q %q", code, out, errOut)
	}
	if n := h.Count(`SELECT count(*) FROM outbox_items WHERE state = 'confirmed'`) + h.Count(`SELECT count(*) FROM reconciliation_items`) +
		h.Count(`SELECT count(*) FROM reconciler_runs`); n != 0 {
		t.Fatalf("the dry run wrote %d rows", n)
	}
	code, out, errOut = runCtl(t, env, "reconcile", "run", "--yes", "--json")
	var rep struct {
		ItemsConfirmed int            `json:"items_confirmed"`
		Findings       map[string]int `json:"findings_by_kind"`
	}
	if code != ExitOK || json.Unmarshal([]byte(out), &rep) != nil || rep.ItemsConfirmed != 1 || rep.Findings["summary_excess"] != 1 {
		t.Fatalf("run: %d %q %q", code, out, errOut)
	}
	code, out, _ = runCtl(t, env, "reconcile", "list", "--json")
	var list struct {
		Items []struct {
			ID   int64  `json:"id"`
			Kind string `json:"kind"`
		} `json:"items"`
	}
	if code != ExitOK || json.Unmarshal([]byte(out), &list) != nil || len(list.Items) != 1 || list.Items[0].Kind != "summary_excess" {
		t.Fatalf("list: %d %q", code, out)
	}
	id := strconv.FormatInt(list.Items[0].ID, 10)
	code, _, errOut = runCtl(t, env, "reconcile", "resolve", id, "--resolution", "  ", "--yes")
	if code != ExitInvalidInput || !strings.Contains(errOut, "invalid_resolution") || !strings.Contains(errOut, "refusal recorded as action #") {
		t.Fatalf("blank: %d %q", code, errOut)
	}
	code, out, _ = runCtl(t, env, "reconcile", "resolve", id, "--resolution", "refund of the double charge", "--evidence", "cn_1")
	if code != ExitOK || !strings.Contains(out, "dry run: nothing written") || !strings.Contains(out, "--yes") {
		t.Fatalf("dry resolve: %d %q", code, out)
	}
	before := h.States()
	code, out, errOut = runCtl(t, env, "reconcile", "resolve", id, "--resolution", "refund of the double charge", "--evidence", "cn_1", "--yes")
	if code != ExitOK || !strings.Contains(out, "nothing else changed") {
		t.Fatalf("resolve: %d %q %q", code, out, errOut)
	}
	if after := h.States(); after["confirmed"] != before["confirmed"] || after["accepted"] != before["accepted"] {
		t.Fatalf("resolve moved items: %v → %v", before, after)
	}
	code, _, errOut = runCtl(t, env, "reconcile", "resolve", id, "--resolution", "again", "--yes")
	if code != ExitRefused || !strings.Contains(errOut, "already_resolved") {
		t.Fatalf("again: %d %q", code, errOut)
	}
	code, out, _ = runCtl(t, env, "reconcile", "inspect", id)
	if code != ExitOK || !strings.Contains(out, "resolve calls (3)") || !strings.Contains(out, "refused invalid_resolution") || !strings.Contains(out, "liam") {
		t.Fatalf("inspect: %d %q", code, out)
	}
	code, out, _ = runCtl(t, env, "recovery", "inspect", strconv.FormatInt(good, 10))
	if code != ExitOK || !strings.Contains(out, "reconciliation: confirmed") || !strings.Contains(out, "settled true, matched true") {
		t.Fatalf("recovery inspect confirmed: %d %q", code, out)
	}
	code, out, _ = runCtl(t, env, "recovery", "inspect", strconv.FormatInt(twice, 10), "--json")
	if code != ExitOK || !strings.Contains(out, `"status": "settled, does not match (committed 3, Stripe 6)"`) {
		t.Fatalf("recovery inspect excess: %d %q", code, out)
	}
	code, _, errOut = runCtl(t, env, "reconcile", "inspect", "999")
	if code != ExitNotFound || !strings.Contains(errOut, "not found") {
		t.Fatalf("not found: %d %q", code, errOut)
	}
}
