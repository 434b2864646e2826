package admin

import (
	"slices"
	"strings"
	"testing"
)

// A misspelt variable is named on stderr with the closest known one, its
// value never printed, and the command's exit code is unchanged.
func TestUnknownVariableWarned(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want []string // stderr lines of the warning, in order
	}{
		{"misspelt account", map[string]string{"AURORA_STRIPE_ACCONT": "acct_other"},
			[]string{"auroractl: warning: unknown variable AURORA_STRIPE_ACCONT is ignored (did you mean AURORA_STRIPE_ACCOUNT?)"}},
		{"two, one line each, sorted", map[string]string{"AURORA_STRIPE_ACCONT": "acct_other", "AURORA_ACTR": "ops"},
			[]string{
				"auroractl: warning: unknown variable AURORA_ACTR is ignored (did you mean AURORA_ACTOR?)",
				"auroractl: warning: unknown variable AURORA_STRIPE_ACCONT is ignored (did you mean AURORA_STRIPE_ACCOUNT?)",
			}},
		{"a service's variable is known", map[string]string{"AURORA_RELAY_WORKERS": "3", "AURORA_STRIPE_ACCOUNT": "acct_x"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCtl(t, tt.env, "key", "--tenant", "org_123", "--subject-kind", "usage_window",
				"--subject-ref", "usage:api_calls:2026-09-01T00:00:00Z:0:5", "--destination-account", "acct_1Test")
			if code != ExitOK || out == "" {
				t.Fatalf("a warning is not a refusal: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(errOut), "\n") {
				if strings.Contains(l, "unknown variable") {
					got = append(got, l)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("stderr %q, want the lines %q", errOut, tt.want)
			}
			if strings.Contains(errOut, "acct_other") {
				t.Errorf("a value was printed: %q", errOut)
			}
		})
	}
	// A failing command keeps its own exit code.
	t.Setenv("AURORA_STRIPE_ACCONT", "acct_other")
	if code, _, errOut := runCtl(t, nil, "nosuchcommand"); code != ExitInvalidInput || !strings.Contains(errOut, "AURORA_STRIPE_ACCONT") {
		t.Errorf("nosuchcommand: exit %d, stderr %q", code, errOut)
	}
}

func TestKnownVarsSorted(t *testing.T) {
	k := KnownVars()
	if !slices.IsSorted(k) || len(slices.Compact(slices.Clone(k))) != len(k) {
		t.Fatal("KnownVars is not sorted and unique")
	}
	for _, n := range EnvVars() {
		if !slices.Contains(k, n) {
			t.Errorf("KnownVars lacks auroractl's own %s", n)
		}
	}
}
