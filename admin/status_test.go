package admin

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/migrations/dbtest"
)

func TestStatusOnAQuietDatabase(t *testing.T) {
	env := map[string]string{"AURORA_DATABASE_URL": dbtest.NewDatabase(t)}
	code, out, errOut := runCtl(t, env, "status")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "nothing needs a person") || strings.Contains(out, "auroractl recovery") {
		t.Errorf("quiet database:\n%s", out)
	}
	code, out, _ = runCtl(t, env, "status", "--json")
	var got statusJSON
	if code != ExitOK || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("--json: exit %d\n%s", code, out)
	}
	for _, l := range got.Lines {
		if l.Value != 0 || l.Next != "" {
			t.Errorf("quiet database: %+v", l)
		}
	}
}

// Every non-zero figure names its next command and runbook section; the
// zero ones name none.
func TestStatusNamesTheNextCommandForEachNonZeroFigure(t *testing.T) {
	d := newRecoveryDB(t) // 2 uncertain, 1 quarantined feature_unmapped, 1 customer_missing
	code, out, errOut := runCtl(t, d.env, "status")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"outbox uncertain", "2", "auroractl recovery list --state uncertain", "[RUNBOOK.md: AuroraUncertainItems]",
		"quarantined feature_unmapped", "auroractl recovery list --state quarantined --reason customer_missing",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "nothing needs a person") {
		t.Errorf("status says nothing needs a person with uncertain items:\n%s", out)
	}
	code, out, _ = runCtl(t, d.env, "status", "--json")
	var got statusJSON
	if code != ExitOK || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("--json: exit %d\n%s", code, out)
	}
	byFigure := map[string]StatusLine{}
	for _, l := range got.Lines {
		byFigure[l.Figure] = l
		if (l.Value != 0) != (l.Next != "") {
			t.Errorf("line %+v: a next command exactly when not zero", l)
		}
	}
	if l := byFigure["outbox uncertain"]; l.Value != 2 || l.Runbook != "AuroraUncertainItems" {
		t.Errorf("uncertain line %+v", l)
	}
	if l := byFigure["outbox quarantined"]; l.Value != 2 {
		t.Errorf("quarantined line %+v", l)
	}
	if got.Snapshot.Outbox.Items["uncertain"] != 2 {
		t.Errorf("snapshot %+v", got.Snapshot.Outbox)
	}
}

func TestStatusFailsWhenTheDatabaseCannotBeMeasured(t *testing.T) {
	env := map[string]string{"AURORA_DATABASE_URL": "postgres://postgres@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=2"}
	code, out, errOut := runCtl(t, env, "status")
	if code != ExitFailure || !strings.Contains(errOut, "cannot measure the database") || out != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
