package admin

import (
	"strings"
	"testing"
)

// recoveryDB's item 3 was built for mapping version 0 (req-2, quarantined
// feature_unmapped; the feature is mapped since); item 4 is built for the
// current version 1.
func TestRecoveryRestageByFeature(t *testing.T) {
	d := newRecoveryDB(t)
	tests := []struct {
		name     string
		args     []string
		code     int
		out      string // substring of stdout
		stderr   string // substring of stderr
		recorded int    // recovery_actions rows after
	}{
		{"neither id nor feature", []string{"recovery", "restage"}, ExitInvalidInput, "", "give an item id, or --feature", 0},
		{"both", []string{"recovery", "restage", "3", "--feature", "api_calls"}, ExitInvalidInput, "", "not both", 0},
		{"dry run lists the candidate only", []string{"recovery", "restage", "--feature", "api_calls", "--account", "acct_1Test"}, ExitOK,
			"item 3: would be rebuilt for mapping version 0 -> 1", "", 0},
		{"current version refused and recorded", []string{"recovery", "restage", "4", "--reason", "r", "--evidence", "e", "--yes"}, ExitRefused,
			"", "mapping_unchanged: item 4 is built for the current mapping version 1; fix the cause and `auroractl recovery requeue 4` (refusal recorded as action #1)", 1},
		{"blank evidence refused", []string{"recovery", "restage", "3", "--reason", "r", "--yes"}, ExitInvalidInput, "", "invalid_evidence", 2},
		{"applied", []string{"recovery", "restage", "--feature", "api_calls", "--reason", "api_calls mapped to mtr_1",
			"--evidence", "meter_mappings: mtr_1 mapping_version 1", "--yes"}, ExitOK, "item 3: rebuilt as item 5 for mapping version 1, same identifier", "", 3},
		{"nothing left", []string{"recovery", "restage", "--feature", "api_calls"}, ExitOK, "nothing to restage", "", 3},
	}
	for _, tt := range tests {
		code, out, errOut := runCtl(t, d.env, tt.args...)
		if code != tt.code || !strings.Contains(out, tt.out) || !strings.Contains(errOut, tt.stderr) {
			t.Errorf("%s: code %d stdout %q stderr %q, want %d, %q, %q", tt.name, code, out, errOut, tt.code, tt.out, tt.stderr)
		}
		if n := d.count(`SELECT count(*) FROM recovery_actions`); n != tt.recorded {
			t.Errorf("%s: %d actions recorded, want %d", tt.name, n, tt.recorded)
		}
	}
	if n := d.count(`SELECT count(*) FROM outbox_items o JOIN outbox_items n ON n.idempotency_key = o.idempotency_key
		WHERE o.id = 3 AND o.state = 'rejected' AND n.id = 5 AND n.state = 'pending' AND n.mapping_version = 1 AND n.dispatch = o.dispatch + 1`); n != 1 {
		t.Fatal("item 3 not rebuilt as item 5 under the same key")
	}
	if n := d.count(`SELECT count(*) FROM usage_events WHERE event_id = 'req-2' AND item_id = 5`); n != 1 {
		t.Fatal("the event's link did not move to the rebuilt item")
	}
	if n := d.count(`SELECT count(*) FROM recovery_actions WHERE item_id = 3 AND action = 'restage' AND applied AND actor = 'liam'
		AND evidence = 'meter_mappings: mtr_1 mapping_version 1' AND subject->'change'->'rebuild'->>'item_id' = '5'`); n != 1 {
		t.Fatal("no audit row for the restage")
	}
}
