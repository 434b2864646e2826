package admin

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/migrations/dbtest"
)

func runCtl(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out, errb bytes.Buffer
	code = Main(context.Background(), args, IO{Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

func TestKeyPrintsREADMEVector(t *testing.T) {
	code, out, _ := runCtl(t, nil, "key", "--tenant", "org_123", "--subject-kind", "usage_window",
		"--subject-ref", "usage:api_calls:2026-09-01T00:00:00Z:0:5", "--destination-account", "acct_1Test")
	if code != 0 || out != "77ccacd8c75a588c78de426666baa67e43c34992cb5ab11df4a94afe3e8601fc\n" {
		t.Fatalf("code %d out %q", code, out)
	}
}

func TestKeyInvalidInput(t *testing.T) {
	tests := [][]string{
		{"key", "--tenant", "org_123"},
		{"key", "--tenant", "org_123", "--subject-kind", "invoice", "--subject-ref", "r", "--destination-account", "a"},
		{"key", "--tenant", "", "--subject-kind", "event", "--subject-ref", "r", "--destination-account", "a"},
		{"key", "--bogus"},
		{"nosuchcommand"},
	}
	for _, args := range tests {
		code, _, stderr := runCtl(t, nil, args...)
		if code != ExitInvalidInput || !strings.HasPrefix(stderr, "auroractl: ") || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: code %d stderr %q", args, code, stderr)
		}
	}
}

func TestMigrateUpTwiceSecondIsNoOp(t *testing.T) {
	url := dbtest.NewEmptyDatabase(t)
	env := map[string]string{"AURORA_DATABASE_URL": url}
	code, out, errs := runCtl(t, env, "migrate", "up")
	if code != 0 || !strings.Contains(out, "applied 00001") {
		t.Fatalf("first up: code %d out %q err %q", code, out, errs)
	}
	code, out, _ = runCtl(t, env, "migrate", "up")
	if code != 0 || out != "up to date: no migrations applied\n" {
		t.Fatalf("second up: code %d out %q", code, out)
	}
	code, out, _ = runCtl(t, env, "migrate", "status")
	if code != 0 || strings.Contains(out, "pending") {
		t.Fatalf("status: code %d out %q", code, out)
	}
}

func TestValidateFlag(t *testing.T) {
	code, out, _ := runCtl(t, map[string]string{"AURORA_DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test", "AURORA_ACTOR": "liam"}, "--validate")
	if code != 0 || out != "configuration valid (actor liam)\n" {
		t.Fatalf("code %d out %q", code, out)
	}
	code, _, stderr := runCtl(t, map[string]string{"AURORA_DATABASE_URL": "mysql://x"}, "recovery", "list", "--validate")
	if code != ExitInvalidInput || !strings.Contains(stderr, "AURORA_DATABASE_URL") {
		t.Fatalf("code %d stderr %q", code, stderr)
	}
}
