package admin

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Bad flag values are refused before the command runs (no database is
// needed to see it), exit 2, naming the flag and never quoting the value.
func TestFlagsRefusedNamingTheFlag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		flag string
	}{
		{"NUL tenant", []string{"provision", "customer", "--account", "acct_1", "--tenant", "org_\x00b"}, "--tenant"},
		{"300-character tenant", []string{"provision", "customer", "--account", "acct_1", "--tenant", strings.Repeat("t", 300)}, "--tenant"},
		{"invalid UTF-8 account", []string{"provision", "account", "--account", "acct_\xff"}, "--account"},
		{"feature with a space", []string{"provision", "meter", "--account", "acct_1", "--feature", "api calls"}, "--feature"},
		{"NUL in a reason", []string{"cutover", "reschedule", "--feature", "api_calls", "--at", "2026-10-01T00:00:00Z",
			"--expect-watermark", "2026-09-01T00:00:00Z", "--reason", "r\x00", "--evidence", "e"}, "--reason"},
		{"NUL in an event id argument", []string{"inbox", "inspect", "evt_\x00b"}, "argument 1"},
		{"newline in a key's tenant", []string{"key", "--tenant", "a\nb", "--subject-kind", "event", "--subject-ref", "event:1", "--destination-account", "acct_1"}, "--tenant"},
	}
	for _, tt := range tests {
		var out, errOut bytes.Buffer
		code := Main(context.Background(), tt.args, IO{Out: &out, Err: &errOut})
		if code != ExitInvalidInput || !strings.Contains(errOut.String(), tt.flag) {
			t.Errorf("%s: exit %d, stderr %q; want %d naming %s", tt.name, code, errOut.String(), ExitInvalidInput, tt.flag)
		}
		if strings.Contains(errOut.String(), "org_") || strings.Contains(errOut.String(), "ttttt") {
			t.Errorf("%s: the value was quoted: %q", tt.name, errOut.String())
		}
	}
	// Free text may hold newlines and any script.
	if r := freeText("the meter was\nre-created — 再作成"); r != "" {
		t.Fatalf("free text refused: %s", r)
	}
}
