package admin

import (
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/migrations/dbtest"
	"github.com/aurora-billing/aurora/shared/outbox"
)

func TestUsageRecord(t *testing.T) {
	url := dbtest.NewDatabase(t)
	env := map[string]string{"AURORA_DATABASE_URL": url, "AURORA_STRIPE_ACCOUNT": "acct_rec", "AURORA_FEATURE_SOURCES": "api_calls:events"}
	ev := []string{"usage", "record", "--tenant", "org_1", "--event-id", "req-1", "--feature", "api_calls", "--quantity", "3", "--occurred-at", "2026-09-01T10:00:00Z"}
	code, out, errOut := runCtl(t, env, append(ev, "--json")...)
	var v recordView
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || !v.Created || v.Item.Quantity != 3 || v.Item.State != "pending" ||
		v.Item.DestinationAccount != "acct_rec" || v.Item.SubjectRef != "event:req-1" {
		t.Fatalf("record: %d %q %q", code, out, errOut)
	}
	assertItemJSONKeys(t, out, v.Item)
	code, out, _ = runCtl(t, env, ev...)
	if code != 0 || !strings.HasPrefix(out, "already recorded (same content) event req-1: item ") {
		t.Fatalf("again: %d %q", code, out)
	}
	fix := []string{"usage", "record", "--tenant", "org_1", "--event-id", "req-1-fix", "--feature", "api_calls", "--quantity", "-1", "--occurred-at", "2026-09-01T10:00:00Z", "--corrects", "req-1"}
	if code, out, errOut = runCtl(t, env, fix...); code != 0 || !strings.HasPrefix(out, "recorded correction req-1-fix: item ") {
		t.Fatalf("correction: %d %q %q", code, out, errOut)
	}
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--quantity", "4"}, ExitRefused, "event_conflict"},
		{[]string{"--quantity", "-2"}, ExitInvalidInput, "quantity"},
		{[]string{"--occurred-at", "yesterday"}, ExitInvalidInput, "RFC 3339"},
		{[]string{"--corrects", "never"}, ExitRefused, "corrected_event_unknown"},
	} {
		args := append([]string{}, ev...)
		for i := 0; i < len(tc.args); i += 2 {
			for j := range args {
				if args[j] == tc.args[i] {
					args[j+1] = tc.args[i+1]
					goto next
				}
			}
			args = append(args, tc.args[i], tc.args[i+1])
		next:
		}
		if tc.args[0] == "--corrects" {
			args[5] = "req-2"
		}
		code, _, errOut := runCtl(t, env, args...)
		if code != tc.code || !strings.Contains(errOut, tc.msg) {
			t.Errorf("%v: %d %q", tc.args, code, errOut)
		}
	}
	if code, _, errOut := runCtl(t, env, "usage", "record", "--tenant", "org_1"); code != ExitInvalidInput || !strings.Contains(errOut, "required flag") {
		t.Fatalf("missing flags: %d %q", code, errOut)
	}
}

// The item of `usage record --json` is named as the rest of auroractl's
// JSON: snake_case keys, the identity's among them (an outbox.Row embeds
// identity.Identity, which printed Tenant, SubjectKind, … before it had
// tags), and exactly the keys `recovery inspect --json` prints for an item.
func assertItemJSONKeys(t *testing.T, out string, row outbox.Row) {
	t.Helper()
	var got struct {
		Item map[string]json.RawMessage `json:"item"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	for k := range got.Item {
		if !snake.MatchString(k) {
			t.Errorf("item key %q is not snake_case", k)
		}
	}
	for k, want := range map[string]string{"tenant": `"org_1"`, "subject_kind": `"event"`, "subject_ref": `"event:req-1"`,
		"exporter": `"stripe_meter_events"`, "destination_account": `"acct_rec"`, "mode": `"test"`, "mapping_version": `0`} {
		if string(got.Item[k]) != want {
			t.Errorf("item %s = %s, want %s", k, got.Item[k], want)
		}
	}
	b, err := json.Marshal(recoveryItemOf(row))
	if err != nil {
		t.Fatal(err)
	}
	var inspect map[string]json.RawMessage
	if err := json.Unmarshal(b, &inspect); err != nil {
		t.Fatal(err)
	}
	if a, b := slices.Sorted(maps.Keys(got.Item)), slices.Sorted(maps.Keys(inspect)); !slices.Equal(a, b) {
		t.Errorf("usage record item keys %v, recovery inspect item keys %v", a, b)
	}
}
